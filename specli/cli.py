"""The typer CLI: parse options, call down (runplan builds the run, show, demo and ui render it). Thin on
purpose: every setting's option is generated from specli.settings' table (specli.flags)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import typer
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from specli.drafters.registry import draft_help
from specli.errors import EXIT_RUNTIME, EXIT_USAGE, UsageProblem, friendly_errors
from specli.flags import SETTING_FLAGS, checked, takes_settings
from specli.runplan import load_run, plan_run, read_prompt
from specli.settings import BENCH, CHAT, DEFAULT_HOST, DEFAULT_PORT, DEMO, EXPORT, RUN, SERVE, valid_text
from specli.ui.console import make_console, note

if TYPE_CHECKING:
    from specli.api import Speculator


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


# -- options shared by several commands (a setting's option is specli.flags', from the settings table) -----

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
ShowRejectedOpt = typer.Option(False, "--show-rejected", help="Show rejected drafts, struck through.")
VerboseOpt = typer.Option(False, "--verbose", help="Show llama.cpp's own log.")
ConfigOpt = typer.Option(None, "--config", metavar="FILE", help="models.toml to look names up in.")
# chat and serve take the target as an argument or as --target, once.
TargetNameArg = typer.Argument(
    None, metavar="MODEL", help="Target: a models.toml name or .gguf path (or use --target)."
)
TargetNameOpt = typer.Option(
    None, "--target", "-m", metavar="MODEL", help="Target model: a .gguf path or a name."
)


ParseSpecialOpt = typer.Option(
    False, "--parse-special",
    help="Read control tokens' texts in message content (<end_of_turn>, <|im_end|>) as control tokens, "
    "as llama-server does; by default content is text, so that no message can end its turn and open "
    "another.",
)


def one_target(name: str | None, target: str | None, command: str) -> None:
    if (name is None) == (target is None):
        raise UsageProblem(
            f"give the target once: `specli {command} NAME` or `specli {command} --target FILE`"
        )


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks on errors."),
    version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_version,
                                 help="Print specli's version (and llama-cpp-python's) and exit."),
) -> None:
    if debug:
        os.environ["SPECLI_DEBUG"] = "1"


@app.command(cls=_Command)
@takes_settings(RUN)
def run(
    prompt: str = typer.Argument(..., metavar="PROMPT", help="The prompt, or '-' to read it from stdin."),
    target: str = TargetOpt,
    draft: str | None = DraftOpt,
    no_draft: bool = NoDraftOpt,
    ngram: bool = NgramOpt,
    given: dict = SETTING_FLAGS,
    show_rejected: bool = ShowRejectedOpt,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object: text, tokens, stats."),
    verbose: bool = VerboseOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Generate a continuation of PROMPT, showing which tokens the draft got right."""
    from specli.show import show_run

    with friendly_errors():
        flags = checked(given)
        text = read_prompt(prompt)
        plan = plan_run(RUN, target, draft, no_draft=no_draft, ngram=ngram, config=config, flags=flags)
        show_run(plan, text, no_draft=no_draft, show_rejected=show_rejected, json_out=json_out,
                 verbose=verbose)


@app.command(cls=_Command)
@takes_settings(BENCH)
def bench(
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
    repeat: int = typer.Option(
        3, "--repeat", min=1, metavar="INT", help="Interleaved plain/speculative pairs per prompt."
    ),
    ngram: bool = NgramOpt,
    given: dict = SETTING_FLAGS,
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
    from specli.bench.command import BenchCommand, run_bench_command

    with friendly_errors():
        run_bench_command(BenchCommand(target, draft, k, temps, prompts, repeat, ngram, given, json_path,
                                       csv_path, servers, api_key, verbose, config))


@app.command(cls=_Command)
@takes_settings(CHAT)
def chat(
    name: str | None = TargetNameArg,
    target: str | None = TargetNameOpt,
    draft: str | None = DraftOpt,
    no_draft: bool = NoDraftOpt,
    system: str | None = typer.Option(None, "--system", metavar="TEXT", help="The system message."),
    ngram: bool = NgramOpt,
    given: dict = SETTING_FLAGS,
    show_rejected: bool = ShowRejectedOpt,
    no_history: bool = typer.Option(
        False, "--no-history", help="Do not read or write the input history file."
    ),
    verbose: bool = VerboseOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Chat with a local model, faster thanks to a draft; /help lists the slash commands."""
    from specli.chat.repl import run_chat
    from specli.chat.session import ChatOptions
    from specli.show import load_shown

    err = make_console(stderr=True)
    with friendly_errors():
        flags = checked(given)
        one_target(name, target, CHAT)
        if system is not None:
            valid_text(system, "--system")
        plan = plan_run(CHAT, name if name is not None else target, draft, no_draft=no_draft, ngram=ngram,
                        config=config, flags=flags)
        spec = load_shown(plan, verbose=verbose, err=err)
        with spec:
            options = ChatOptions(system=system, settings=plan.settings, show_rejected=show_rejected,
                                  history=not no_history)
            code = run_chat(spec, options, console=make_console(), err_console=err)
    raise typer.Exit(code)


@app.command(cls=_Command)
@takes_settings(SERVE)
def serve(
    name: str | None = TargetNameArg,
    target: str | None = TargetNameOpt,
    draft: str | None = DraftOpt,
    no_draft: bool = NoDraftOpt,
    ngram: bool = NgramOpt,
    host: str = typer.Option(
        DEFAULT_HOST, "--host", metavar="HOST",
        help="Address to listen on. Anything but loopback lets other machines use the model: set --api-key.",
    ),
    port: int = typer.Option(
        DEFAULT_PORT, "--port", min=0, max=65535, metavar="PORT", help="Port to listen on (0: any free port)."
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
    parse_special: bool = ParseSpecialOpt,
    given: dict = SETTING_FLAGS,
    verbose: bool = VerboseOpt,
    config: Path | None = ConfigOpt,
) -> None:
    """Serve the model over an OpenAI-compatible API, with a chat page that shows the draft at work.

    Each request's settings default to these options; its own fields (temperature, max_tokens, seed,
    speculative.n_max ...) override them. One generation runs at a time; others wait in a queue.
    """
    from specli.serve.access import checked_access
    from specli.serve.app import ServeOptions
    from specli.serve.server import serve as run_server

    err = make_console(stderr=True)
    with friendly_errors():
        flags = checked(given)
        one_target(name, target, SERVE)
        api_key = checked_access(alias, api_key, allow_origin)
        plan = plan_run(SERVE, name or target, draft, no_draft=no_draft, ngram=ngram, config=config,
                        flags=flags)
        for text in plan.notes:
            err.print(Text.assemble(("note: ", "yellow"), text))
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


@app.command(cls=_Command)
@takes_settings(EXPORT)
def export(
    to: str = typer.Option(..., "--to", metavar="ENGINE", help="llama-server, vllm or sglang."),
    target: str = TargetOpt,
    draft: str | None = DraftOpt,
    no_draft: bool = NoDraftOpt,
    from_bench: Path | None = typer.Option(
        None, "--from-bench", metavar="FILE",
        help="A `specli bench --json` file: export the k it measured best (for -k auto).",
    ),
    ngram: bool = NgramOpt,
    given: dict = SETTING_FLAGS,
    host: str = typer.Option(DEFAULT_HOST, "--host", metavar="HOST", help="The address to listen on."),
    port: int = typer.Option(DEFAULT_PORT, "--port", min=1, max=65535, metavar="PORT", help="Its port."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object: argv, command, notes."),
    config: Path | None = ConfigOpt,
) -> None:
    """Print the llama-server, vLLM or SGLang command that serves this pair with these settings."""
    from specli.export import ENGINES, build_export, export_input, hf_repos

    err = make_console(stderr=True)
    with friendly_errors():
        if to not in ENGINES:
            raise UsageProblem(f"--to must be one of {', '.join(ENGINES)}, got {to!r}")
        flags = checked(given)
        plan = plan_run(RUN, target, draft, no_draft=no_draft, ngram=ngram, config=config, flags=flags)
        result = build_export(export_input(plan, hf_repos(plan, config)), to, bench_file=from_bench,
                              host=host, port=port)
        if json_out:
            print(json.dumps(result.as_dict(), ensure_ascii=False))
            return
        print(result.shell(), flush=True)
        for text in plan.notes + result.notes:
            note(err, text)


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
    from specli.models_cmd import list_models

    with friendly_errors():
        list_models(config, json_out)


@models_app.command("check", cls=_Command)
def models_check(
    target: str = typer.Argument(..., metavar="TARGET", help="Target: a .gguf path or a models.toml name."),
    draft: str = typer.Argument(..., metavar="DRAFT", help="Draft: a .gguf path or a models.toml name."),
    config: str | None = ConfigOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Can DRAFT draft for TARGET? The engine's vocabulary check, as a report."""
    from specli.models_cmd import check_pair

    with friendly_errors():
        check_pair(target, draft, config, verbose)


@app.command("demo-models", cls=_Command)
def demo_models(
    directory: Path = typer.Argument(Path("demo-models"), metavar="DIR", help="Where to write the pair."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if the files exist."),
) -> None:
    """Write a realistic-shaped demo pair (target ~ Qwen2-0.5B in shape, draft ~15x cheaper), offline."""
    from specli.demo import write_demo_pair

    with friendly_errors():
        write_demo_pair(directory, force=force, err=make_console(stderr=True))


@app.command(cls=_Command)
@takes_settings(DEMO)
def demo(
    prompt: str | None = typer.Argument(
        None, metavar="PROMPT", help="The prompt (default: one that shows it)."
    ),
    synthetic: bool = typer.Option(
        False, "--synthetic", help="The synthetic demo pair even when Gemma 3 270M is installed."
    ),
    directory: Path = typer.Option(
        Path("demo-models"), "--dir", metavar="DIR", help="Where the synthetic pair lives (built if absent)."
    ),
    given: dict = SETTING_FLAGS,
) -> None:
    """See speculation at work in one command: Gemma 3 270M (the [gemma] extra) with n-gram lookup
    rewriting a passage, then its speed against plain decoding; the synthetic pair otherwise."""
    from specli.demo import run_demo

    err = make_console(stderr=True)
    with friendly_errors():
        run_demo(prompt, synthetic=synthetic, directory=directory, flags=checked(given), err=err)


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
