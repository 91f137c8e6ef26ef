"""Render the event stream: coloured tokens as they arrive, then a stats panel.

The UI only consumes events; it never calls the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from specli.drafters.base import Source
from specli.drafters.registry import colour_of
from specli.events import Event, Origin, RejectedEvent, TokenEvent
from specli.stats import GenerationStats

ORIGIN_STYLES: dict[Origin, str] = {
    Origin.ACCEPTED: "green",
    Origin.CORRECTED: "yellow",
    Origin.BONUS: "cyan",
    Origin.PLAIN: "",
}
# Accepted tokens take the colour of the source that drafted them (the drafter registry's) when a
# drafter has more than one (combined drafting: a draft model and n-gram lookup).
REJECTED_STYLE = "red dim strike"
# Without colours (TERM=dumb, NO_COLOR) a struck-through token would read as part of the output:
# rejected drafts are bracketed instead, as `git diff --word-diff` marks removed words.
REJECTED_PLAIN = ("[-", "-]")


def legend(show_rejected: bool, sources: Sequence[Source] = (), *, styled: bool = True) -> Text:
    """What the colours mean; without colours, only how rejected drafts are marked (if shown)."""
    text = Text()
    if not styled:
        if show_rejected:
            text.append("rejected drafts are shown as " + "text".join(REJECTED_PLAIN))
        return text
    if len(sources) > 1:
        for source in sources:
            text.append("■ ", style=colour_of(source.name))
            text.append(f"accepted ({source.name})  ", style="dim")
    else:
        text.append("■ ", style="green")
        text.append("accepted draft  ", style="dim")
    text.append("■ ", style="yellow")
    text.append("target's correction  ", style="dim")
    text.append("■ ", style="cyan")
    text.append("bonus (all drafts accepted)  ", style="dim")
    if show_rejected:
        text.append("rejected", style=REJECTED_STYLE)
    return text


class TokenPrinter:
    """Writes each token's text in its origin's colour as the events arrive (accepted tokens in their
    source's colour when the drafter has more than one source)."""

    def __init__(
        self, console: Console, *, show_rejected: bool = False, sources: Sequence[Source] = ()
    ) -> None:
        from specli.ui.console import shows_styles

        self.console = console
        self.show_rejected = show_rejected
        self.styled = shows_styles(console)
        self.source_styles = (
            {s.name: colour_of(s.name) for s in sources} if len(sources) > 1 else {}
        )

    def __call__(self, event: Event) -> None:
        if isinstance(event, TokenEvent):
            if not event.text:
                return
            style = ORIGIN_STYLES[event.origin]
            if event.origin is Origin.ACCEPTED and event.drafter:
                style = self.source_styles.get(event.drafter, style)
            self.console.print(Text(event.text, style=style), end="", soft_wrap=True)
        elif isinstance(event, RejectedEvent) and self.show_rejected and event.text:
            shown = event.text if self.styled else event.text.join(REJECTED_PLAIN)
            self.console.print(Text(shown, style=REJECTED_STYLE), end="", soft_wrap=True)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f} ms"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def length_bins(longest: int) -> list[tuple[int, int]]:
    """The rows of the accepted-drafts histogram: one per length up to 4, then doubling ranges (5-8,
    9-16, 17-32, 33-64), so a run whose rounds accepted up to 64 drafts takes 8 rows, not 65."""
    bins = [(n, n) for n in range(min(longest, 4) + 1)]
    low = 5
    while low <= longest:
        bins.append((low, min(2 * (low - 1), longest)))
        low = 2 * (low - 1) + 1
    return bins


def histogram(stats: GenerationStats, width: int = 30) -> Table:
    """Accepted drafts per round: how often each length (or range of lengths) occurred."""
    table = Table.grid(padding=(0, 1))
    counts = stats.accepted_per_round
    if not counts:
        return table
    rows = [(low, high, sum(c for n, c in counts.items() if low <= n <= high))
            for low, high in length_bins(max(counts))]
    top = max(c for _, _, c in rows)
    label_width = len(str(rows[-1][1])) * 2 + 1
    for low, high, c in rows:
        bar = "█" * max(1 if c else 0, round(width * c / top))
        label = str(low) if low == high else f"{low}-{high}"
        table.add_row(Text(label.rjust(label_width), style="dim"),
                      Text(bar, style="green" if high else "yellow"), Text(str(c)))
    return table


def stats_panel(stats: GenerationStats, *, title: str | Text = "speculation", drafting: bool = True) -> Panel:
    """The figures of a generation. `drafting`: a drafter was loaded; without one (plain decoding) the
    drafting rows (drafts, acceptance, the draft's cost, the verify rule) would only say n/a."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim")
    t.add_column(justify="right")
    t.add_column(style="dim")
    t.add_column(justify="right")
    rate = stats.tokens_per_second
    prompt_rate = (stats.n_prompt_evaluated / stats.prompt_seconds) if stats.prompt_seconds > 0 else None
    predicted = stats.predicted_speedup
    t.add_row(
        "tokens generated", str(stats.n_generated), "tokens/s", "n/a" if rate is None else f"{rate:.1f}"
    )
    if drafting:
        t.add_row(
            "rounds",
            str(stats.rounds),
            "tokens/round",
            "n/a" if stats.tokens_per_round is None else f"{stats.tokens_per_round:.2f}",
        )
        t.add_row(
            "drafted / accepted", f"{stats.drafted} / {stats.accepted}", "acceptance",
            _pct(stats.acceptance_rate)
        )
        t.add_row(
            "draft",
            f"{_ms(stats.draft_ms_per_token)}/token",
            "target verify",
            f"{_ms(stats.verify_ms_per_round)}/round",
        )
    t.add_row(
        "prompt eval",
        f"{stats.n_prompt_evaluated} tok, {_ms(1000 * stats.prompt_seconds)}",
        "prompt tok/s",
        "n/a" if prompt_rate is None else f"{prompt_rate:.0f}",
    )
    if drafting:
        t.add_row(
            "outside llama_decode",
            _pct(stats.overhead_fraction),
            "predicted speedup",
            "n/a" if predicted is None else f"{predicted:.2f}×",
        )
    else:
        t.add_row("outside llama_decode", _pct(stats.overhead_fraction), "target decode",
                  f"{_ms(stats.verify_ms_per_round)}/token")
    if stats.sampling_mode:
        # Without a draft there is no verify rule: only whether it sampled.
        mode = stats.sampling_mode if drafting or stats.sampling_mode == "greedy" else "sampled"
        t.add_row("sampling", mode, "seed", "n/a" if stats.seed is None else str(stats.seed))
    if stats.accepted_by_drafter and len(stats.accepted_by_drafter) > 1:
        t.add_row(
            "accepted by drafter",
            ", ".join(f"{k}: {v}" for k, v in stats.accepted_by_drafter.items()),
            "",
            "",
        )
    parts: list = [t]
    if stats.auto_reason:
        # Why -k auto decoded most tokens plainly, from its own figures: a right "no" or a wrong one.
        parts.append(Text.assemble(("auto  ", "dim"), (stats.auto_reason, "yellow")))
    if stats.drafting_rounds:
        parts += [Text("accepted drafts per round", style="dim"), histogram(stats)]
    ks = stats.k_per_round
    if ks and len(set(ks)) > 1:
        parts += [Text("draft length k over the run", style="dim"), Text(sparkline(ks), style="blue")]
    subtitle = f"stop: {stats.stop_reason}" if stats.stop_reason else None
    return Panel(Group(*parts), title=title, subtitle=subtitle, expand=False)


_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[int], width: int = 60) -> str:
    """Values squeezed into at most `width` bins (bin means), drawn with block characters."""
    if not values:
        return ""
    means = [
        float(b.mean()) for b in np.array_split(np.asarray(values, dtype=float), min(width, len(values)))
    ]
    top = max(max(means), 1e-9)
    bars = "".join(_SPARK[round(m / top * (len(_SPARK) - 1))] for m in means)
    return f"{bars}  (k {min(values)}..{max(values)}, mean {sum(values) / len(values):.1f})"


def stats_lines(stats: GenerationStats) -> str:
    """The stats as plain text lines (for stderr when stdout is not a terminal): `n/a` where a figure
    does not apply (JSON's null), and auto's reason when it decoded most tokens plainly."""
    d = stats.as_dict()
    keys = [
        "generated_tokens",
        "rounds",
        "drafted",
        "accepted",
        "acceptance_rate",
        "tokens_per_round",
        "draft_ms_per_token",
        "verify_ms_per_round",
        "prompt_tokens",
        "prompt_seconds",
        "tokens_per_second",
        "overhead_fraction",
        "predicted_speedup",
        "stop_reason",
        "sampling_mode",
        "seed",
    ]
    if d["auto_reason"]:
        keys.append("auto_reason")
    return "\n".join(f"{k}: {'n/a' if d[k] is None else d[k]}" for k in keys)
