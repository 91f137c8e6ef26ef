"""Render a bench: progress while it runs, then the verify-cost curve, the results table, a speedup
chart, the per-prompt breakdown and the caveats.

Consumes specli.bench's dataclasses only; never runs anything.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from specli.bench.aggregate import bench_notes
from specli.bench.measure import BenchProgress
from specli.bench.prediction import VerifyCurve
from specli.bench.results import BenchResult, ConfigResult, Spread
from specli.drafters.registry import DRAFTERS
from specli.settings import AUTO

_EIGHTHS = " ▏▎▍▌▋▊▉█"
# A prediction off from the measured speedup by more than this factor either way is not shown: it
# prices the runs' draft time with a verify curve measured at another moment, and a machine whose
# load changed in between gave "predicted 0.00×, efficiency 6622 %".
CREDIBLE = 3.0


def credible_prediction(c: ConfigResult) -> bool:
    """Whether the configuration's predicted speedup (and its efficiency) describe its runs."""
    return (c.predicted_speedup is not None and c.efficiency is not None
            and 1 / CREDIBLE <= c.efficiency <= CREDIBLE)


# -- progress ---------------------------------------------------------------------------------------------


class RichBenchProgress:
    """BenchProgress on a rich progress display. No background refresh thread: it would compete with
    the timed runs for the CPU and the GIL; the display is redrawn only when the bench reports a step
    (between timed sections)."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description:<12}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("[dim]{task.fields[detail]}"),
            console=console,
            auto_refresh=False,
            transient=True,
        )
        self._task: TaskID | None = None

    def phase(self, name: str, total: int) -> None:
        self._finish_task()
        # the columns are markup templates: escape what is filled in (a prompt may be named a[/]b)
        self._task = self._progress.add_task(escape(name), total=max(total, 1), detail="")
        self._progress.refresh()

    def step(self, detail: str = "") -> None:
        if self._task is not None:
            self._progress.update(self._task, advance=1, detail=escape(detail))
            self._progress.refresh()

    def _finish_task(self) -> None:
        if self._task is not None:
            task = self._progress.tasks[-1]
            self._progress.update(self._task, completed=task.total, visible=False)
            self._task = None

    def __enter__(self) -> RichBenchProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._finish_task()
        self._progress.stop()


@contextmanager
def bench_progress(console: Console) -> Iterator[BenchProgress | None]:
    """Progress bars on `console` when it is a terminal; None (silent) otherwise."""
    if not console.is_terminal:
        yield None
        return
    with RichBenchProgress(console) as progress:
        yield progress


# -- formatting -------------------------------------------------------------------------------------------


def _num(x: float | None, fmt: str = ".1f", suffix: str = "") -> str:
    return "n/a" if x is None else f"{x:{fmt}}{suffix}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def _rate(s: Spread) -> Text:
    if s.median is None:
        return Text("n/a", style="dim")
    t = Text(_sig(s.median))
    if s.n > 1 and s.p75 is not None and s.p25 is not None:
        t.append(f" ±{_sig((s.p75 - s.p25) / 2)}", style="dim")
    return t


def _sig(x: float) -> str:
    """A rate with the digits that mean something: 1234, 123, 12.3, 1.23."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _speedup_style(x: float | None) -> str:
    if x is None:
        return "dim"
    return "green" if x >= 1.0 else "red"


def _bar(value: float, scale: float, width: int) -> str:
    """A left-aligned bar of value / scale of `width` cells, in eighths of a cell."""
    eighths = max(0, round(8 * width * min(value, scale) / scale))
    full, part = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[part] if part else "")).ljust(width)


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _count(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


# -- sections ---------------------------------------------------------------------------------------------


def header(result: BenchResult) -> Panel:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim")
    t.add_column()
    cfg, m = result.config, result.machine
    if result.target:
        # Text cells: file names and prompt names are the user's, never markup
        target = result.target
        t.add_row("target", Text(f"{Path(target.path).name}  ({_count(target.n_params)} params, "
                                 f"{_size(target.file_bytes)}, vocab {target.n_vocab})"))
    if result.draft:
        t.add_row("draft", Text(f"{Path(result.draft.path).name}  ({_count(result.draft.n_params)} params, "
                                f"{_size(result.draft.file_bytes)})" + ("  + n-gram" if cfg.ngram else "")))
    else:
        kind = DRAFTERS.get(result.drafter)
        what = kind.description if kind is not None else "no draft model"
        name = result.drafter if kind is None or kind.reserved else Path(str(cfg.draft)).name
        t.add_row("draft", Text(f"{name}  ({what})"))
    threads = result.target.n_threads if result.target else cfg.n_threads
    t.add_row("machine", f"{m.get('platform')} · {m.get('cpus_usable')} CPUs · {threads} thread"
                         f"{'' if threads == 1 else 's'} · "
                         f"llama-cpp-python {m.get('llama_cpp_python')}")
    repeats = f"{cfg.repeat} repeat{'' if cfg.repeat == 1 else 's'}"
    t.add_row("runs", f"{len(cfg.prompt_list())} prompts × {repeats} × (plain + speculative), "
                      f"-n {cfg.max_tokens}, per temperature × k")
    t.add_row("wall time", f"runs {result.runs_seconds:.1f} s; not in any rate: "
                           f"load {result.load_seconds:.2f} s, warm-up {result.warmup_seconds:.2f} s, "
                           f"verify curve {result.curve_seconds:.2f} s")
    return Panel(t, title="specli bench", expand=False)


def draft_costs(result: BenchResult) -> tuple[float | None, float | None]:
    """(ms per drafted token, ms per block pass or None): the draft model's single-token decode the curve
    timed, else what the runs' drafting rounds took (a trained head, a block drafter's pass)."""
    curve, measured = result.curve, [c for c in result.configs if c.c_pass_ms is not None]
    if result.drafter_block and measured:
        return None, float(statistics.median(c.c_pass_ms for c in measured))
    if curve is not None and curve.draft_ms_per_token is not None:
        return curve.draft_ms_per_token, None
    per_token = [c.c_draft_ms for c in result.configs if c.c_draft_ms is not None]
    return (statistics.median(per_token) if per_token else None), None


def curve_table(curve: VerifyCurve, ks: list, *, width: int = 28, c_draft: float | None = None,
                c_pass: float | None = None) -> Table:
    """T_v(m) per batch size, its ratio to T_v(1) as a bar, and the acceptance at which k = m - 1
    drafts per round would break even with plain decoding (drafting k at c_draft ms a token, or one
    block pass of c_pass ms)."""
    c_draft = c_draft if c_draft is not None else curve.draft_ms_per_token or 0.0
    table = Table(title="target verify cost by batch size m = k + 1", title_justify="left",
                  title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("m", justify="right")
    table.add_column("T_v(m)", justify="right")
    table.add_column("× T_v(1)", justify="right")
    table.add_column("", no_wrap=True)
    table.add_column("k = m − 1 pays when α >", justify="right")
    top = max(curve.ratio(p.m) for p in curve.points)
    wanted = {int(k) for k in ks if k != AUTO}
    for p in curve.points:
        k = p.m - 1
        be = curve.break_even_alpha(k, c_draft, c_pass) if k else None
        if not k:
            be_text = Text("—", style="dim")
        elif be is None:
            be_text = Text("never", style="red")
        else:
            be_text = Text(f"{be:.2f}", style="bold" if k in wanted else "")
        ratio = curve.ratio(p.m)
        table.add_row(str(p.m), f"{p.ms:.2f} ms", f"{ratio:.2f}", Text(_bar(ratio, top, width), style="blue"),
                      be_text)
    return table


def curve_caption(result: BenchResult) -> Text:
    t = Text(style="dim")
    curve, drafter = result.curve, result.drafter
    assert curve is not None
    per_token, per_pass = draft_costs(result)
    if per_pass is not None:
        t.append(f"draft: one {drafter} pass (a block of up to {result.drafter_block} positions) "
                 f"{per_pass:.2f} ms = {per_pass / curve.ms(1):.2f} × T_v(1), in the runs' drafting rounds. ")
    elif per_token is not None:
        source = "" if curve.draft_ms_per_token is not None else ", in the runs"
        t.append(f"draft: {drafter} {per_token:.2f} ms/token = {per_token / curve.ms(1):.2f} × T_v(1)"
                 f"{source}. ")
    else:
        t.append(f"draft: {drafter} (no model, cost ≈ 0 in the break-even column). ")
    t.append("A flat curve (GPU) lets long drafts pay; a steep one (CPU) needs high acceptance.")
    return t


def results_table(result: BenchResult, *, compact: bool = False) -> Table:
    """One row per (temperature, k). compact: without the spreads and time shares, for narrow
    terminals (every figure is still in --json)."""
    best = result.best
    title = ("plain vs speculative: medians over pairs" if compact else
             "plain vs speculative: medians over pairs (± half the interquartile range)")
    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False,
                  box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, collapse_padding=compact)
    names = ["T", "k", "plain\ntok/s", "spec\ntok/s", "speedup" if compact else "speedup\nmedian  IQR",
             "spec\nwon", "accept", "tok/\nround", "pred-\nicted", "effi-\nciency", "same\nas plain"]
    if not compact:
        names.append("draft/verify/\nother %")
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    last_temp = None
    for c in result.configs:
        if last_temp is not None and c.temperature != last_temp:
            table.add_section()
        last_temp = c.temperature
        is_best = best is not None and c is best
        sp = c.speedup
        speed = Text(_num(sp.median, ".2f", "×"),
                     style=_speedup_style(sp.median) + (" bold" if is_best else ""))
        if not compact and sp.n > 1 and sp.p25 is not None and sp.p75 is not None:
            speed.append(f" {sp.p25:.2f}–{sp.p75:.2f}", style="dim")
        k_text = str(c.k) if c.k != AUTO or c.mean_k is None else f"{AUTO}≈{c.mean_k:.1f}"
        rates = (_rate(c.plain_tps), _rate(c.spec_tps)) if not compact else (
            _num(c.plain_tps.median and float(_sig(c.plain_tps.median)), "g"),
            _num(c.spec_tps.median and float(_sig(c.spec_tps.median)), "g"))
        cells: list[Text | str] = [
            ("★ " if is_best else "") + f"{c.temperature:g}", k_text, *rates, speed, f"{c.wins}/{c.pairs}",
            _pct(c.acceptance_rate), _num(c.tokens_per_round, ".2f"),
            *((_num(c.predicted_speedup, ".2f", "×"), _pct(c.efficiency)) if credible_prediction(c)
              else ("–", "–")),
            _same(c, result.config.settings.same_as_plain),
        ]
        if not compact:
            cells.append("/".join(_num(None if x is None else 100 * x, ".0f") for x in
                                  (c.draft_share, c.verify_share, c.other_share)))
        table.add_row(*cells, style="bold" if is_best else None)
    return table


def _same(c: ConfigResult, same_as_plain: bool) -> Text:
    """Pairs whose speculative tokens equal the plain run's (greedy, or same-as-plain at any T)."""
    if not (c.temperature == 0 or same_as_plain):
        return Text("–", style="dim")
    text = Text(f"{c.pairs - c.mismatches}/{c.pairs}", style="red" if c.mismatches else "green")
    if c.first_forks:
        text.append(f" @{min(c.first_forks)}", style="dim")
    return text


def _fits(console: Console, renderable: Table) -> bool:
    # Measured without the console's width limit, which would clamp the answer to fit.
    return console.measure(renderable, options=console.options.update_width(10_000)).maximum <= console.width


def speedup_chart(configs: list[ConfigResult], *, width: int = 40) -> Table:
    """One bar per (temperature, k) to its median speedup, with a marker at 1.0× (break-even)."""
    values = [c.speedup.median for c in configs if c.speedup.median is not None]
    scale = max([1.0, *values]) * 1.15
    mark = min(width - 1, round(width * 1.0 / scale))
    table = Table.grid(padding=(0, 1))
    table.add_column(justify="right", style="dim")
    table.add_column(no_wrap=True)
    table.add_column(justify="right")
    last_temp = None
    for c in configs:
        if last_temp is not None and c.temperature != last_temp:
            table.add_row("", "", "")
        last_temp = c.temperature
        x = c.speedup.median
        bar = Text()
        cells = _bar(x or 0.0, scale, width)
        style = _speedup_style(x)
        bar.append(cells[:mark], style=style)
        bar.append("┃" if cells[mark] == " " else "╋", style="bold white")
        bar.append(cells[mark + 1:], style=style)
        value = Text(_num(x, ".2f", "×"), style=style)
        table.add_row(f"T={c.temperature:g} k={c.k}", bar, value)
    table.add_row("", Text(" " * mark + "1.0×", style="dim"), "")
    return table


def per_prompt_table(configs: list[ConfigResult]) -> Table:
    """Median speedup per prompt (rows) and configuration (columns): where speculation pays."""
    table = Table(title="speedup by prompt", title_justify="left", title_style="bold", show_edge=False,
                  pad_edge=False)
    table.add_column("prompt", no_wrap=True)
    for c in configs:
        table.add_column(f"T{c.temperature:g}\nk{c.k}", justify="right", no_wrap=True)
    names = list(dict.fromkeys(p.prompt for c in configs for p in c.per_prompt))
    for name in names:
        cells: list[Text | str] = [Text(name)]
        for c in configs:
            pr = next((p for p in c.per_prompt if p.prompt == name), None)
            x = pr.speedup.median if pr else None
            cells.append(Text(_num(x, ".2f"), style=_speedup_style(x)))
        table.add_row(*cells)
    return table


def servers_table(result: BenchResult) -> Table:
    """`bench --server`: each server beside the local runs of the same configuration."""
    table = Table(title="servers (same prompts, seeds and settings, run after each local pair)",
                  title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    for name in ("config", "run on", "tok/s", "server tok/s", "first token", "× local plain", "drafted",
                 "accepted", "acceptance"):
        table.add_column(name, justify="left" if name in ("config", "run on") else "right", no_wrap=True)
    local = {(c.temperature, c.k): c for c in result.configs}
    for key in dict.fromkeys((s.temperature, s.k) for s in result.server_configs):
        c = local.get(key)
        if c is not None:
            table.add_row(Text(c.label), Text("specli (plain)"), _rate(c.plain_tps), "", "", "1.00×",
                          "", "", "")
            table.add_row("", Text("specli (speculative)"), _rate(c.spec_tps), "", "",
                          _num(c.speedup.median, ".2f", "×"), "", "", _pct(c.acceptance_rate))
        for s in (s for s in result.server_configs if (s.temperature, s.k) == key):
            ttft = s.ttft_seconds.median
            table.add_row("" if c is not None else Text(s.label), Text(s.server), _rate(s.tokens_per_second),
                          _rate(s.server_tokens_per_second), _num(None if ttft is None else 1000 * ttft,
                                                                  ".0f", " ms"),
                          _num(s.vs_plain.median, ".2f", "×"), _whole(s.drafted), _whole(s.accepted),
                          _pct(s.acceptance_rate))
    return table


def _whole(n: int | None) -> str:
    return "n/a" if n is None else str(n)


def verdict(result: BenchResult) -> Text:
    best = result.best
    if best is None:
        return Text("no complete pairs: nothing to compare", style="yellow")
    sp = best.speedup
    t = Text()
    if sp.median is not None and sp.median >= 1.0:
        t.append("best: ", style="bold")
        t.append(f"T={best.temperature:g} k={best.k}", style="bold green")
        t.append(f" — {sp.median:.2f}× plain decoding", style="green")
    else:
        t.append("speculation did not pay here: ", style="bold red")
        t.append(f"the best configuration, T={best.temperature:g} k={best.k}, ran at "
                 f"{_num(sp.median, '.2f')}× plain decoding")
    t.append(f" (faster in {best.wins} of {best.pairs} pairs", style="dim")
    if sp.min is not None and sp.max is not None and sp.n > 1:
        t.append(f", range {sp.min:.2f}–{sp.max:.2f}×", style="dim")
    t.append(")", style="dim")
    if best.predicted_speedup is not None and credible_prediction(best):
        t.append(f"; the cost model predicts {best.predicted_speedup:.2f}× from the measured acceptance "
                 f"and costs", style="dim")
        if best.efficiency is not None:
            t.append(f" (efficiency {100 * best.efficiency:.0f} %)", style="dim")
    return t


def render_bench(result: BenchResult, console: Console) -> None:
    """Everything a bench measured, for a terminal."""
    console.print(header(result))
    if result.curve is not None:
        console.print()
        per_token, per_pass = draft_costs(result)
        console.print(curve_table(result.curve, result.config.ks, c_draft=per_token, c_pass=per_pass))
        console.print(curve_caption(result))
    if result.configs:
        console.print()
        table = results_table(result)
        if not _fits(console, table):
            table = results_table(result, compact=True)
        console.print(table)
        console.print(Text("predicted: Leviathan et al. with two acceptance rates (first draft a1, later "
                           "a2), the draft cost and the verify curve, as -k auto predicts · efficiency = "
                           "measured / predicted (– where off by more than 3× either way: the verify curve "
                           "and the runs were timed under different loads) · spec won: pairs in which "
                           "speculative decoding was faster",
                           style="dim"))
        console.print()
        console.print(Group(Text("median speedup (┃ = 1.0×, break-even)", style="bold"),
                            speedup_chart(result.configs)))
        if len({p.prompt for c in result.configs for p in c.per_prompt}) > 1:
            console.print()
            configs = result.configs
            table = per_prompt_table(configs)
            best = result.best
            if not _fits(console, table) and best is not None:
                # Too many configurations for the width: the best temperature's, or the best alone.
                table = per_prompt_table([c for c in configs if c.temperature == best.temperature])
                if not _fits(console, table):
                    table = per_prompt_table([best])
            console.print(table)
    if result.server_configs:
        console.print()
        console.print(servers_table(result))
        console.print(Text("tok/s: medians; a server's is timed here, from its first streamed token to its "
                           "last (server tok/s: its own timings, where it reports them) · first token: from "
                           "sending the request · × local plain: paired with the local plain run beside it",
                           style="dim"))
    console.print()
    for level, message in bench_notes(result):
        style = "yellow" if level == "warn" else "dim"
        console.print(Text(f"{'note' if level == 'info' else 'warning'}: {message}", style=style))
    console.print(verdict(result))
