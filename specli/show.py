"""One generation, shown: the plan's models loaded under a status line, the tokens streamed to a terminal
(coloured by where they came from) or a pipe, then the stats, or one JSON object. `specli run`'s body,
which the demo runs too."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.text import Text

from specli.engine import GenerationParams, sampling_path
from specli.errors import EXIT_INTERRUPTED, UsageProblem
from specli.events import TokenEvent
from specli.llama import PromptTooLong
from specli.native import reason as native_reason
from specli.runplan import Plan, load_run
from specli.ui.console import make_console, note, shows_styles

if TYPE_CHECKING:
    from specli.api import Speculator
    from specli.engine import Generation


def load_shown(plan: Plan, *, verbose: bool, err: Console) -> Speculator:
    """Load the plan's models under a status line, and say what the user should know about them."""
    for text in plan.notes:
        note(err, text)
    what = plan.target.name + (f" + {Path(plan.draft).name}" if plan.draft else "")
    with err.status(Text(f"loading {what}")):
        spec, notes = load_run(plan, verbose=verbose)
    for text in notes:
        note(err, text)
    return spec


def title_of(spec: Speculator) -> Text:
    drafter = spec.drafter.name if spec.drafter else "no draft"
    return Text(f"{spec.target.path.name} · {drafter}")  # Text: a file name is not markup


def show_run(plan: Plan, text: str, *, no_draft: bool, show_rejected: bool, json_out: bool,
             verbose: bool) -> None:
    """`specli run`: generate a continuation of `text` with the plan's models and settings, and show it."""
    out = make_console()
    err = make_console(stderr=True)
    params = GenerationParams.of(plan.settings)
    spec = load_shown(plan, verbose=verbose, err=err)
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
            note(err, f"decoding plainly: {why}")
        mode = "json" if json_out else ("terminal" if out.is_terminal else "pipe")
        if verbose:
            filters, why = sampling_path(spec.target, params.sampling, params.sampling_on)
            if filters is None and not params.sampling.greedy:
                why += f"; filters: {native_reason()}"
            note(err, f"sampling: {'host' if filters is None else 'backend'} ({why})")
        generation = stream_generation(spec, prompt_tokens, params, mode, out, show_rejected=show_rejected,
                                       prompt_text=text)
        _show_result(spec, generation, params, len(prompt_tokens), mode, out, err)
    stats = generation.stats
    if stats.stop_reason == "context":
        err.print(
            f"[yellow]note:[/] the context ({spec.target.n_ctx} tokens) is full after "
            f"{stats.n_generated} generated tokens; raise --ctx to generate more"
        )
    if stats.stop_reason == "interrupted":
        raise typer.Exit(EXIT_INTERRUPTED)


def _show_result(spec: Speculator, generation: Generation, params: GenerationParams, n_prompt: int,
                 mode: str, out: Console, err: Console) -> None:
    """After the text: one JSON object (--json), the stats panel (a terminal), or the stats' lines on
    stderr (a pipe)."""
    stats = generation.stats
    if mode == "json":
        print(json.dumps({"text": generation.text, "tokens": generation.tokens, "prompt_tokens": n_prompt,
                          "seed": params.seed, "sampling_mode": stats.sampling_mode,
                          "stats": stats.as_dict()}, ensure_ascii=False))
    elif mode == "terminal":
        from specli.ui.stream import stats_panel

        out.print()
        out.print(stats_panel(stats, title=title_of(spec), drafting=spec.drafter is not None))
    else:
        from specli.ui.stream import stats_lines

        print(file=sys.stdout, flush=True)
        err.print(Text(stats_lines(stats)), soft_wrap=True)  # one line a figure, however long


def stream_generation(spec: Speculator, prompt_tokens: list[int], params: GenerationParams, mode: str,
                      out: Console, *, show_rejected: bool, prompt_text: str) -> Generation:
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
