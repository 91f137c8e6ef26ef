"""The typer CLI: parse, resolve names, call down. Thin on purpose."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from specli.errors import EXIT_INTERRUPTED, UsageProblem, friendly_errors
from specli.events import TokenEvent

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
    None, "--draft", "-md", help="Draft: a .gguf path, a models.toml name, or 'ngram' (prompt lookup, no model)."
)
NoDraftOpt = typer.Option(False, "--no-draft", help="Plain target decoding through the same code path (baseline).")
MaxTokensOpt = typer.Option(256, "-n", "--max-tokens", min=1, help="Tokens to generate at most.")
DraftMaxOpt = typer.Option("auto", "-k", "--draft-max", help="Tokens drafted per round (0..64), or 'auto'.")
DraftPMinOpt = typer.Option(
    0.0, "--draft-p-min", min=0.0, max=1.0, help="Stop drafting when the draft's own confidence falls below P."
)
NgramOpt = typer.Option(False, "--ngram", help="With a draft model: use n-gram matches first (combined drafting).")
TempOpt = typer.Option(0.8, "--temp", min=0.0, help="Temperature; 0 is greedy.")
TopKOpt = typer.Option(40, "--top-k", min=0, help="Keep the k most likely tokens (0: off).")
TopPOpt = typer.Option(0.95, "--top-p", min=0.0, max=1.0, help="Nucleus sampling mass, in (0, 1] (1: off).")
MinPOpt = typer.Option(0.05, "--min-p", min=0.0, max=1.0, help="Drop tokens below P × the top probability (0: off).")
SeedOpt = typer.Option(None, "-s", "--seed", help="Random seed (default: random; the one used is in --json).")
CtxOpt = typer.Option(4096, "-c", "--ctx", min=16, help="Context size in tokens.")
ThreadsOpt = typer.Option(0, "-t", "--threads", min=0, help="CPU threads (0: one per core).")
GpuLayersOpt = typer.Option(0, "-ngl", "--gpu-layers", min=0, help="Layers to offload to the GPU (Metal/CUDA builds).")
VerboseOpt = typer.Option(False, "--verbose", help="Show llama.cpp's own log.")


def _parse_draft_max(value: str) -> int | str:
    if value == "auto":
        return "auto"
    try:
        k = int(value)
    except ValueError:
        raise UsageProblem(f"--draft-max must be a whole number or 'auto', not {value!r}") from None
    if not 0 <= k <= 64:
        raise UsageProblem(f"--draft-max must be between 0 and 64, got {k}")
    return k


def _read_prompt(prompt: str) -> str:
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise UsageProblem("the prompt is empty: give text as the argument, or '-' to read it from stdin")
    return prompt


def _resolve_model(name_or_path: str, config: Path | None) -> Path:
    """A .gguf path as given, or a models.toml name; the file is validated before llama.cpp sees it."""
    from specli.gguf_info import validate_gguf

    path = Path(name_or_path).expanduser()
    if not (path.suffix == ".gguf" or path.exists() or "/" in name_or_path):
        from specli.config import find_config, load_config

        found = find_config(config)
        if found is None:
            raise UsageProblem(
                f"{name_or_path!r} is not a file, and no models.toml was found to look it up in "
                "(give a .gguf path, or see `specli models`)"
            )
        path = load_config(found).resolve(name_or_path).path
    info = validate_gguf(path)
    if info.is_recurrent:
        pass  # the engine refuses speculation on these with its own message
    return path


def _load(target: str, draft: str | None, *, no_draft: bool, ngram: bool, ctx: int, threads: int,
          gpu_layers: int, draft_p_min: float, verbose: bool, config: Path | None, err: Console):
    from specli import llama
    from specli.api import NGRAM, load

    llama.set_verbose(verbose)
    target_path = _resolve_model(target, config)
    draft_arg: str | Path | None = None
    if not no_draft and draft is not None:
        draft_arg = NGRAM if draft == NGRAM else _resolve_model(draft, config)
        if draft_arg != NGRAM and Path(draft_arg).resolve() == target_path.resolve():
            err.print("[yellow]note:[/] the draft is the target itself: every draft is accepted, "
                      "but drafting costs as much as verifying, so this cannot be faster")
    with err.status(f"loading {target_path.name}" + (f" + {Path(draft_arg).name}" if draft_arg else "")):
        return load(target_path, draft_arg, n_ctx=ctx, n_threads=threads, n_gpu_layers=gpu_layers,
                    draft_p_min=draft_p_min, ngram=ngram and draft_arg not in (None, NGRAM))


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks on errors."),
) -> None:
    if debug:
        import os

        os.environ["SPECLI_DEBUG"] = "1"


@app.command()
def run(
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
    ctx: int = CtxOpt,
    threads: int = ThreadsOpt,
    gpu_layers: int = GpuLayersOpt,
    stop: list[str] = typer.Option([], "--stop", help="Stop when this text appears (repeatable)."),
    show_rejected: bool = typer.Option(False, "--show-rejected", help="Show rejected drafts, struck through."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object: text, tokens, stats."),
    verbose: bool = VerboseOpt,
    config: Path | None = typer.Option(None, "--config", help="models.toml to look names up in."),
) -> None:
    """Generate a continuation of PROMPT, showing which tokens the draft got right."""
    from specli.engine import GenerationParams
    from specli.sampling import SamplingParams

    out = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    with friendly_errors():
        k = _parse_draft_max(draft_max)
        if top_p <= 0:
            raise UsageProblem("--top-p must be in (0, 1]")
        text = _read_prompt(prompt)
        if seed is None:
            import secrets

            seed = secrets.randbelow(2**31)
        params = GenerationParams(
            max_tokens=max_tokens,
            sampling=SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p),
            seed=seed,
            stop=tuple(stop),
            draft_max=k,
        )
        spec = _load(target, draft, no_draft=no_draft, ngram=ngram, ctx=ctx, threads=threads,
                     gpu_layers=gpu_layers, draft_p_min=draft_p_min, verbose=verbose, config=config, err=err)
        with spec:
            prompt_tokens = spec.tokenize(text)
            mode = "json" if json_out else ("terminal" if out.is_terminal else "pipe")
            interrupted = _stream(spec, prompt_tokens, params, mode, out, err, show_rejected=show_rejected,
                                  prompt_text=text)
            stats = spec.stats
            if mode == "json":
                print(json.dumps({
                    "text": spec.engine.text,
                    "tokens": list(spec.engine.tokens),
                    "prompt_tokens": len(prompt_tokens),
                    "seed": seed,
                    "stats": stats.as_dict(),
                }, ensure_ascii=False))
            elif mode == "terminal":
                from specli.ui.stream import stats_panel

                out.print()
                out.print(stats_panel(stats, title=_title(spec)))
            else:
                from specli.ui.stream import stats_lines

                print(file=sys.stdout, flush=True)
                err.print(stats_lines(stats), highlight=False)
        if interrupted:
            raise typer.Exit(EXIT_INTERRUPTED)


def _title(spec) -> str:
    drafter = spec.drafter.name if spec.drafter else "no draft"
    return f"{spec.target.path.name} · {drafter}"


def _stream(spec, prompt_tokens, params, mode: str, out: Console, err: Console, *, show_rejected: bool,
            prompt_text: str) -> bool:
    """Run one generation and render it; True if Ctrl-C stopped it (the stats stay valid)."""
    from specli.ui.stream import TokenPrinter, legend

    printer = None
    if mode == "terminal":
        drafters = ("draft", "ngram") if spec.drafter and spec.drafter.name == "combined" else ("draft",)
        if spec.drafter:
            out.print(legend(show_rejected, drafters))
        out.print(prompt_text, style="bold", end="")
        printer = TokenPrinter(out, show_rejected=show_rejected, colour_drafters=len(drafters) > 1)
    events = spec.engine.generate(prompt_tokens, params)
    try:
        for event in events:
            if printer is not None:
                printer(event)
            elif mode == "pipe" and isinstance(event, TokenEvent):
                sys.stdout.write(event.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        events.close()
        spec.stats.stop_reason = "interrupted"
        return True
    return False


def main() -> None:
    app()


if __name__ == "__main__":
    main()
