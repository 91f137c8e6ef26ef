"""The typer CLI: parse options, call down (runplan builds the run, ui renders it). Thin on purpose."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from specli.errors import EXIT_INTERRUPTED, EXIT_USAGE, UsageProblem, friendly_errors
from specli.events import TokenEvent
from specli.options import (
    DEFAULT_MIN_P,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    parse_draft_max,
    valid_text,
)
from specli.runplan import (
    check_ngram,
    generation_params,
    load_plan,
    plan_models,
    read_prompt,
    validated,
)
from specli.ui.console import make_console

if TYPE_CHECKING:
    from specli.engine import Generation

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="rich",
    help="Speculative decoding for local GGUF models: a small draft proposes, the target verifies, "
    "the output distribution is the target's own.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


# -- shared option definitions (one place, so run/bench/chat agree) ---------------------------------------

TargetOpt = typer.Option(..., "--target", "-m", help="Target model: a .gguf path or a models.toml name.")
DraftOpt = typer.Option(
    None,
    "--draft",
    "-md",
    help="Draft: a .gguf path, a models.toml name, 'ngram' (prompt lookup, no model) or 'mtp' (the "
    "target's own MTP layers).",
)
NoDraftOpt = typer.Option(
    False, "--no-draft", help="Plain target decoding through the same code path (baseline)."
)
MaxTokensOpt = typer.Option(256, "-n", "--max-tokens", min=1, help="Tokens to generate at most.")
DraftMaxOpt = typer.Option(
    "auto", "-k", "--draft-max",
    help="Tokens drafted per round (0..64), or 'auto': chosen from measured costs and draft confidence.",
)
DraftPMinOpt = typer.Option(
    0.0,
    "--draft-p-min",
    min=0.0,
    max=1.0,
    help="Stop drafting in a round when the draft's top probability falls below P.",
)
NgramOpt = typer.Option(
    False, "--ngram", help="With a draft model: use n-gram matches first (combined drafting)."
)
TempOpt = typer.Option(DEFAULT_TEMPERATURE, "--temp", min=0.0, help="Temperature; 0 is greedy.")
TopKOpt = typer.Option(DEFAULT_TOP_K, "--top-k", min=0, help="Keep the k most likely tokens (0: off).")
TopPOpt = typer.Option(
    DEFAULT_TOP_P, "--top-p", min=0.0, max=1.0, help="Nucleus sampling mass, in (0, 1] (1: off)."
)
MinPOpt = typer.Option(
    DEFAULT_MIN_P, "--min-p", min=0.0, max=1.0, help="Drop tokens below P × the top probability (0: off)."
)
SeedOpt = typer.Option(
    None, "-s", "--seed", help="Random seed (default or -1: random; the one used is in --json)."
)
SameAsPlainOpt = typer.Option(
    True,
    "--same-as-plain/--no-same-as-plain",
    help="Accept a draft token only where it equals the target's own draw, so a seeded run prints exactly "
    "what --no-draft prints (default). --no-same-as-plain: the classic rejection rule, higher acceptance "
    "with a draft model, same distribution, but not plain's tokens.",
)
CtxOpt = typer.Option(4096, "-c", "--ctx", min=16, help="Context size in tokens.")
ThreadsOpt = typer.Option(0, "-t", "--threads", min=0, help="CPU threads (0: one per core).")
GpuLayersOpt = typer.Option(
    0, "-ngl", "--gpu-layers", min=0, help="Layers to offload to the GPU (Metal/CUDA builds)."
)
VerboseOpt = typer.Option(False, "--verbose", help="Show llama.cpp's own log.")


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks on errors."),
) -> None:
    if debug:
        import os

        os.environ["SPECLI_DEBUG"] = "1"


@app.command()
def run(
    context: typer.Context,
    prompt: str = typer.Argument(..., help="The prompt, or '-' to read it from stdin."),
    target: str = TargetOpt,
    draft: str | None = DraftOpt,
    no_draft: bool = NoDraftOpt,
    max_tokens: int = MaxTokensOpt,
    draft_max: str = DraftMaxOpt,
    draft_p_min: float = DraftPMinOpt,
    ngram: bool = NgramOpt,
    temp: float = TempOpt,
    top_k: int = TopKOpt,
    top_p: float = TopPOpt,
    min_p: float = MinPOpt,
    seed: int | None = SeedOpt,
    same_as_plain: bool = SameAsPlainOpt,
    ctx: int = CtxOpt,
    threads: int = ThreadsOpt,
    gpu_layers: int = GpuLayersOpt,
    stop: list[str] = typer.Option([], "--stop", help="Stop when this text appears (repeatable)."),
    ignore_eos: bool = typer.Option(
        False, "--ignore-eos", help="Never stop at end-of-text: generate -n tokens."
    ),
    show_rejected: bool = typer.Option(
        False, "--show-rejected", help="Show rejected drafts, struck through."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object: text, tokens, stats."),
    verbose: bool = VerboseOpt,
    config: Path | None = typer.Option(None, "--config", help="models.toml to look names up in."),
) -> None:
    """Generate a continuation of PROMPT, showing which tokens the draft got right."""
    out = make_console()
    err = make_console(stderr=True)
    with friendly_errors():
        parse_draft_max(draft_max)
        for s in stop:
            valid_text(s, "--stop")
        text = read_prompt(prompt)
        plan = plan_models(context, target, draft, no_draft=no_draft, config=config)
        check_ngram(ngram, plan.draft)
        params = replace(
            generation_params(plan.values, tuple(stop)), ignore_eos=ignore_eos, same_as_plain=same_as_plain
        )
        spec = load_plan(plan, ngram=ngram, draft_p_min=draft_p_min, verbose=verbose, err=err)
        with spec:
            prompt_tokens = spec.tokenize(text)
            if len(prompt_tokens) >= spec.target.n_ctx:
                raise UsageProblem(
                    f"the prompt is {len(prompt_tokens)} tokens but the context holds {spec.target.n_ctx}: "
                    "raise --ctx or shorten the prompt"
                )
            mode = "json" if json_out else ("terminal" if out.is_terminal else "pipe")
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
                out.print(stats_panel(stats, title=_title(spec)))
            else:
                from specli.ui.stream import stats_lines

                print(file=sys.stdout, flush=True)
                err.print(Text(stats_lines(stats)))
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
        if spec.drafter:
            out.print(legend(show_rejected, sources))
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


@app.command()
def bench(
    context: typer.Context,
    target: str = TargetOpt,
    draft: str | None = DraftOpt,
    k: str = typer.Option("1,2,4,8", "-k", "--draft-max", help="Draft lengths to compare, e.g. 1,2,4,auto."),
    temps: str = typer.Option("0,0.7,1.0", "--temp", help="Temperatures to compare, e.g. 0,0.7,1.0."),
    prompts: Path | None = typer.Option(None, "--prompts", help="Your prompts: one per line, or JSONL."),
    max_tokens: int = typer.Option(128, "-n", "--max-tokens", min=1, help="Tokens per run."),
    repeat: int = typer.Option(3, "--repeat", min=1, help="Interleaved plain/speculative pairs per prompt."),
    draft_p_min: float = DraftPMinOpt,
    ngram: bool = NgramOpt,
    top_k: int = TopKOpt,
    top_p: float = TopPOpt,
    min_p: float = MinPOpt,
    seed: int = typer.Option(0, "-s", "--seed", help="Seed of the first pair (pairs share a seed)."),
    same_as_plain: bool = SameAsPlainOpt,
    ctx: int = typer.Option(2048, "-c", "--ctx", min=16, help="Context size in tokens."),
    threads: int = ThreadsOpt,
    gpu_layers: int = GpuLayersOpt,
    ignore_eos: bool = typer.Option(
        True, "--ignore-eos/--stop-at-eos", help="Generate exactly -n tokens per run (as llama-bench)."
    ),
    json_path: Path | None = typer.Option(None, "--json", help="Write every figure to this JSON file."),
    csv_path: Path | None = typer.Option(None, "--csv", help="Write one row per run to this CSV file."),
    verbose: bool = VerboseOpt,
    config: Path | None = typer.Option(None, "--config", help="models.toml to look names up in."),
) -> None:
    """Does speculation pay here? Plain and speculative runs, interleaved, side by side."""
    from specli import llama
    from specli.bench.files import write_csv, write_json
    from specli.bench.measure import run_bench
    from specli.bench.suite import BenchConfig, load_prompts, parse_k_list, parse_temp_list
    from specli.ui.bench_view import bench_progress, render_bench

    out = make_console()
    err = make_console(stderr=True)
    with friendly_errors():
        # Output paths first: a result is never measured only to be lost on a bad path.
        outputs = [(_output_path(p, opt), writer) for p, opt, writer in
                   ((json_path, "--json", write_json), (csv_path, "--csv", write_csv)) if p is not None]
        plan = plan_models(context, target, draft, no_draft=False, config=config)
        if plan.draft is None:
            raise UsageProblem("bench compares against a drafter: give --draft (a model, or 'ngram')")
        if plan.draft == "mtp":
            raise UsageProblem("bench does not run --draft mtp yet: compare with `specli run --json`")
        check_ngram(ngram, plan.draft)
        llama.set_verbose(verbose)
        v = plan.values
        if v.get("seed") is None:
            import secrets

            v["seed"] = secrets.randbelow(2**31)
        cfg = BenchConfig(
            target=plan.target,
            draft=plan.draft,
            ks=parse_k_list(k),
            temps=parse_temp_list(temps),
            prompts=load_prompts(prompts) if prompts else None,
            max_tokens=max_tokens,
            repeat=repeat,
            n_ctx=v["ctx"],
            n_threads=v["threads"],
            n_gpu_layers=v["gpu_layers"],
            seed=v["seed"],
            same_as_plain=same_as_plain,
            top_k=v["top_k"],
            top_p=v["top_p"],
            min_p=v["min_p"],
            draft_p_min=draft_p_min,
            ngram=ngram,
            ignore_eos=ignore_eos,
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


def _output_path(path: Path, option: str) -> Path:
    from specli.fileio import FileProblem, check_output_path

    try:
        return check_output_path(path, option)
    except FileProblem as e:
        raise UsageProblem(str(e)) from None


def _write_failure(problems: list[str]) -> typer.Exit:
    from specli.errors import fail

    return fail("; ".join(problems) + " (the report above has the results)")


@app.command()
def chat(
    context: typer.Context,
    name: str | None = typer.Argument(
        None, help="Target: a models.toml name or .gguf path (or use --target)."
    ),
    target: str | None = typer.Option(None, "--target", "-m", help="Target model: a .gguf path or a name."),
    draft: str | None = DraftOpt,
    no_draft: bool = NoDraftOpt,
    system: str | None = typer.Option(None, "--system", help="The system message."),
    max_tokens: int = typer.Option(512, "-n", "--max-tokens", min=1, help="Tokens per reply at most."),
    draft_max: str = DraftMaxOpt,
    draft_p_min: float = DraftPMinOpt,
    ngram: bool = NgramOpt,
    temp: float = TempOpt,
    top_k: int = TopKOpt,
    top_p: float = TopPOpt,
    min_p: float = MinPOpt,
    seed: int | None = SeedOpt,
    same_as_plain: bool = SameAsPlainOpt,
    ctx: int = CtxOpt,
    threads: int = ThreadsOpt,
    gpu_layers: int = GpuLayersOpt,
    show_rejected: bool = typer.Option(
        False, "--show-rejected", help="Show rejected drafts, struck through."
    ),
    no_history: bool = typer.Option(
        False, "--no-history", help="Do not read or write the input history file."
    ),
    verbose: bool = VerboseOpt,
    config: Path | None = typer.Option(None, "--config", help="models.toml to look names up in."),
) -> None:
    """Chat with a local model, faster thanks to a draft; /help lists the slash commands."""
    from specli.chat.repl import run_chat
    from specli.chat.session import ChatOptions

    err = make_console(stderr=True)
    with friendly_errors():
        parse_draft_max(draft_max)
        if (name is None) == (target is None):
            raise UsageProblem("give the target once: `specli chat NAME` or `specli chat --target FILE`")
        if system is not None:
            valid_text(system, "--system")
        plan = plan_models(context, name or target, draft, no_draft=no_draft, config=config)
        check_ngram(ngram, plan.draft)
        v = plan.values
        spec = load_plan(plan, ngram=ngram, draft_p_min=draft_p_min, verbose=verbose, err=err)
        with spec:
            options = ChatOptions(
                system=system,
                max_tokens=v["max_tokens"],
                temperature=v["temp"],
                top_k=v["top_k"],
                top_p=v["top_p"],
                min_p=v["min_p"],
                draft_max=parse_draft_max(str(v["draft_max"])),
                seed=v["seed"],
                same_as_plain=same_as_plain,
                show_rejected=show_rejected,
                history=not no_history,
            )
            code = run_chat(spec, options, console=make_console(), err_console=err)
    raise typer.Exit(code)


models_app = typer.Typer(help="The models.toml registry: list entries, check a target/draft pair.")
app.add_typer(models_app, name="models")


@models_app.callback(invoke_without_command=True)
def models_list(
    context: typer.Context,
    config: Path | None = typer.Option(None, "--config", help="models.toml to read."),
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
        rows = model_rows(load_config(found))
        if json_out:
            print(json.dumps(rows, default=str))
            return
        from specli.ui.models_table import render_models_table

        out.print(render_models_table(rows, title=Text(f"models in {found}")))


@models_app.command("check")
def models_check(
    target: str = typer.Argument(..., help="Target: a .gguf path or a models.toml name."),
    draft: str = typer.Argument(..., help="Draft: a .gguf path or a models.toml name."),
    config: Path | None = typer.Option(None, "--config", help="models.toml to look names up in."),
    verbose: bool = VerboseOpt,
) -> None:
    """Can DRAFT draft for TARGET? The engine's vocabulary check, as a report."""
    from rich.table import Table

    from specli import llama
    from specli.compat import check_vocab
    from specli.config import find_config, load_config

    out = make_console()
    with friendly_errors():
        found = find_config(config)
        cfg = load_config(found) if found else None
        paths = [validated(cfg.resolve(x).path if cfg else Path(x).expanduser()) for x in (target, draft)]
        llama.set_verbose(verbose)
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
        from specli_synth.demo import DEMO_DRAFT_FILE, DEMO_TARGET_FILE, build_demo_pair
    except ImportError:
        raise UsageProblem(
            "the demo pair is written by specli-synth, which is not installed: run `pip install ./synth` "
            "in specli's repository (or install specli with its [demo] extra)"
        ) from None
    return DEMO_DRAFT_FILE, DEMO_TARGET_FILE, build_demo_pair


@app.command("demo-models")
def demo_models(
    directory: Path = typer.Argument(Path("demo-models"), help="Where to write the pair."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if the files exist."),
) -> None:
    """Write a realistic-shaped demo pair (target ~ Qwen2-0.5B in shape, draft ~15x cheaper), offline."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    err = make_console(stderr=True)
    with friendly_errors():
        DEMO_DRAFT_FILE, DEMO_TARGET_FILE, build_demo_pair = _demo_writer()
        target, draft = directory / DEMO_TARGET_FILE, directory / DEMO_DRAFT_FILE
        if target.is_file() and draft.is_file() and not force:
            err.print(Text(f"demo pair already in {directory} (use --force to rebuild)"))
            return
        directory.mkdir(parents=True, exist_ok=True)
        columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
        with Progress(*columns, console=err, disable=not err.is_terminal) as progress:
            task = progress.add_task("building", total=1.0)

            def report(stage: str, fraction: float) -> None:
                progress.update(task, description=stage, completed=fraction)

            target, draft = build_demo_pair(directory, progress=report)
        err.print(Text(f"wrote {target} and {draft}"))
        err.print(Text(f'try: specli run --target {target} --draft {draft} "Once upon a time"'))


@app.command()
def demo(
    directory: Path = typer.Option(
        Path("demo-models"), "--dir", help="Where the demo pair lives (built if absent)."
    ),
    prompt: str = typer.Argument("The function returns", help="The prompt."),
    max_tokens: int = typer.Option(96, "-n", "--max-tokens", min=1, help="Tokens to generate at most."),
    temp: float = typer.Option(0.0, "--temp", min=0.0, help="Temperature; 0 is greedy."),
    draft_max: str = typer.Option(
        "3", "-k", "--draft-max", help="Tokens drafted per round (fixed so the colours show), or 'auto'."
    ),
) -> None:
    """Build the demo pair if needed, then show `specli run` on it: the live view in one command."""
    with friendly_errors():
        DEMO_DRAFT_FILE, DEMO_TARGET_FILE, _ = _demo_writer()
    if not (directory / DEMO_TARGET_FILE).is_file() or not (directory / DEMO_DRAFT_FILE).is_file():
        demo_models(directory, force=False)
    target, draft = str(directory / DEMO_TARGET_FILE), str(directory / DEMO_DRAFT_FILE)
    args = [
        "run",
        "--target",
        target,
        "--draft",
        draft,
        "-n",
        str(max_tokens),
        "--temp",
        str(temp),
        "-k",
        draft_max,
        "--show-rejected",
        prompt,
    ]
    app(args, standalone_mode=False)


def main() -> None:
    """The console script: every way of exiting goes through one error format and exit code."""
    try:
        from typer._click import exceptions  # recent typer vendors click
    except ImportError:  # pragma: no cover - older typer on the real click
        from click import exceptions

    if len(sys.argv) <= 1:
        app(["--help"])  # no arguments: the help, as `no_args_is_help` would show it
    try:
        code = app(standalone_mode=False)
    except typer.Exit as e:
        code = e.exit_code
    except typer.Abort:
        print("specli: interrupted", file=sys.stderr, flush=True)
        code = EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print("specli: interrupted", file=sys.stderr, flush=True)
        code = EXIT_INTERRUPTED
    except exceptions.ClickException as e:
        # typer/click's checks (-n 0, --temp -1, a missing option ...): one line like our own, not a box
        message = " ".join(e.format_message().split())
        print(f"specli: error: {message}", file=sys.stderr, flush=True)
        code = EXIT_USAGE if isinstance(e, exceptions.UsageError) else e.exit_code
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
