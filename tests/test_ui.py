"""The terminal view: token colours per origin (and per drafter in combined mode), struck-through
rejected drafts, the legend and the stats panel, rendered as a terminal would get them.

Styles are read back from the ANSI output (rich's own decoder), per character, and compared with a
table written here from the README (green accepted, yellow corrected, cyan bonus, magenta n-gram in
combined mode, red struck-through rejected), not with the module's own style constants.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from typing import NamedTuple
from unittest import mock

import pytest
from rich.console import Console
from rich.style import Style
from rich.text import Text
from typer.testing import CliRunner

from specli import GenerationParams, SamplingParams, load
from specli.cli import app
from specli.drafters.base import Source
from specli.drafters.ngram import NGramDrafter
from specli.drafters.registry import DRAFT_MODEL, NGRAM_LOOKUP
from specli.events import DoneEvent, Origin, RejectedEvent, RoundEvent, TokenEvent
from specli.stats import GenerationStats
from specli.ui.stream import TokenPrinter, legend, sparkline, stats_lines, stats_panel


class Look(NamedTuple):
    """What a character looks like on the terminal: its ANSI colour number (None: default) and attributes."""

    colour: int | None
    dim: bool = False
    strike: bool = False
    bold: bool = False


# The eight standard ANSI colours: 1 red, 2 green, 3 yellow, 5 magenta, 6 cyan.
PLAIN = Look(None)
GREEN, YELLOW, CYAN, MAGENTA = Look(2), Look(3), Look(6), Look(5)
REJECTED = Look(1, dim=True, strike=True)


def terminal() -> Console:
    return Console(file=io.StringIO(), width=100, color_system="truecolor", force_terminal=True,
                   highlight=False, legacy_windows=False)


def looks(ansi: str) -> tuple[str, list[Look]]:
    """The plain text of ANSI output and each character's look."""
    text = Text.from_ansi(ansi)
    per_char = [Style() for _ in text.plain]
    for span in text.spans:
        style = Style.parse(span.style) if isinstance(span.style, str) else span.style
        for i in range(span.start, span.end):
            per_char[i] = per_char[i] + style
    return text.plain, [
        Look(s.color.number if s.color else None, bool(s.dim), bool(s.strike), bool(s.bold)) for s in per_char
    ]


def expected_looks(events: list, *, show_rejected: bool, combined: bool) -> tuple[str, list[Look]]:
    """What the README says the stream of events should look like."""
    by_origin = {Origin.ACCEPTED: GREEN, Origin.CORRECTED: YELLOW, Origin.BONUS: CYAN, Origin.PLAIN: PLAIN}
    text, out = "", []
    for e in events:
        if isinstance(e, TokenEvent):
            look = by_origin[e.origin]
            if combined and e.origin is Origin.ACCEPTED and e.drafter == "ngram":
                look = MAGENTA
            text += e.text
            out += [look] * len(e.text)
        elif isinstance(e, RejectedEvent) and show_rejected:
            text += e.text
            out += [REJECTED] * len(e.text)
    return text, out


def _token(text: str, origin: Origin, drafter: str | None = None) -> TokenEvent:
    return TokenEvent(1, text, origin, 0, drafter if origin is Origin.ACCEPTED else None)


SYNTHETIC = [
    _token("The", Origin.PLAIN),
    _token(" cat", Origin.ACCEPTED, "draft"),
    _token(" sat", Origin.ACCEPTED, "ngram"),
    RejectedEvent([5, 6], " ran off", 1, "draft"),
    _token(" on", Origin.CORRECTED),
    _token("", Origin.ACCEPTED, "draft"),  # an incomplete UTF-8 character: nothing to show yet
    _token(" the", Origin.ACCEPTED, "draft"),
    _token(" mat", Origin.BONUS),
    RejectedEvent([9], "", 2, "ngram"),  # a rejected proposal with no text of its own
    RoundEvent(index=2, drafter="draft", k=2, accepted=2, emitted=3, draft_seconds=0.0, verify_seconds=0.0,
               other_seconds=0.0),
    DoneEvent("length", "The cat sat on the mat"),
]


# What the drafters declare, named by the registry (front ends never test for a drafter's name).
MODEL_SOURCES = (Source(DRAFT_MODEL.name),)
COMBINED_SOURCES = (*MODEL_SOURCES, *NGramDrafter(NGRAM_LOOKUP.name).sources)


@pytest.mark.parametrize("show_rejected", [False, True])
@pytest.mark.parametrize("combined", [False, True])
def test_token_printer_styles_each_origin(show_rejected: bool, combined: bool) -> None:
    console = terminal()
    sources = COMBINED_SOURCES if combined else MODEL_SOURCES
    printer = TokenPrinter(console, show_rejected=show_rejected, sources=sources)
    for event in SYNTHETIC:
        printer(event)
    text, got = looks(console.file.getvalue())
    want_text, want = expected_looks(SYNTHETIC, show_rejected=show_rejected, combined=combined)
    assert text == want_text
    assert got == want
    assert (" ran off" in text) == show_rejected
    assert (MAGENTA in got) == combined  # n-gram acceptances stand apart only in combined mode


def test_token_printer_never_wraps_or_breaks_lines() -> None:
    """Tokens are printed as they come, without a newline after each one or folding at the width."""
    console = terminal()
    printer = TokenPrinter(console)
    words = [_token(f" word{i}", Origin.ACCEPTED, "draft") for i in range(40)]  # 280 characters
    for event in words:
        printer(event)
    text, _ = looks(console.file.getvalue())
    assert text == "".join(e.text for e in words)


def test_legend_names_what_is_shown() -> None:
    console = terminal()
    console.width = 200  # one line each
    console.print(legend(False))
    console.print(legend(True, COMBINED_SOURCES))
    text, got = looks(console.file.getvalue())
    single, combined = text.split("\n")[:2]
    assert "accepted draft" in single and "target's correction" in single and "bonus" in single
    assert "rejected" not in single
    assert "accepted (draft)" in combined and "accepted (ngram)" in combined and "rejected" in combined
    # Each square carries its colour: the one before "accepted (ngram)" is magenta.
    offset = len(single) + 1
    squares = [offset + m.start() for m in re.finditer("■", combined)]
    assert [got[i] for i in squares] == [GREEN, MAGENTA, YELLOW, CYAN]
    rejected_at = offset + combined.index("rejected")
    assert got[rejected_at] == REJECTED


# -- the stats panel ----------------------------------------------------------------------------------------


def panel_stats() -> GenerationStats:
    """Figures chosen so that every panel entry has a known rendering."""
    return GenerationStats(
        n_prompt=12, n_prompt_evaluated=9, prompt_seconds=0.030, n_generated=14, rounds=6, drafted=14,
        accepted=8, rejections=3, draft_seconds=0.010, verify_seconds=0.097, generation_seconds=0.2,
        decode_seconds=0.15, stop_reason="eos",
        accepted_per_round=Counter({0: 2, 1: 1, 3: 4}), k_per_round=[0, 4, 4, 2, 0, 4, 4],
        accepted_by_drafter=Counter({"draft": 7, "ngram": 1}),
        verify_by_size={1: [2, 0.022], 3: [1, 0.015], 5: [3, 0.060]},
    )


def render(renderable, width: int = 100) -> tuple[str, list[Look]]:
    console = terminal()
    console.width = width
    console.print(renderable)
    return looks(console.file.getvalue())


def test_stats_panel_shows_the_figures() -> None:
    stats = panel_stats()
    text, _ = render(stats_panel(stats, title="target.gguf · combined"))
    rows = [
        r"tokens generated\s+14\s+tokens/s\s+70\.0",
        r"rounds\s+6\s+tokens/round\s+2\.33",
        r"drafted / accepted\s+14 / 8\s+acceptance\s+57\.1 %",
        r"draft\s+0\.7 ms/token\s+target verify\s+16\.2 ms/round",
        r"prompt eval\s+9 tok, 30\.0 ms\s+prompt tok/s\s+300",
        r"outside llama_decode\s+25\.0 %\s+predicted speedup\s+" + f"{stats.predicted_speedup:.2f}×",
        r"accepted by drafter\s+draft: 7, ngram: 1",
        r"target\.gguf · combined",
        r"stop: eos",
        r"\(k 0\.\.4, mean 2\.6\)",
    ]
    for row in rows:
        assert re.search(row, text), row


def test_histogram_bars_are_proportional_to_the_counts() -> None:
    text, got = render(stats_panel(panel_stats()))
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if "accepted drafts per round" in line) + 1
    bars = {}
    for line in lines[start:start + 4]:
        m = re.search(r"│\s*(\d+) (█*)\s+(\d+)", line)
        assert m, line
        bars[int(m.group(1))] = (len(m.group(2)), int(m.group(3)))
    # Lengths 0..3, the longest (4 rounds) 30 blocks wide, a length never seen has no bar.
    assert bars == {0: (15, 2), 1: (8, 1), 2: (0, 0), 3: (30, 4)}
    # No acceptance is yellow (a correction), accepted runs are green.
    offset = sum(len(line) + 1 for line in lines[:start])
    zero_bar = offset + lines[start].index("█")
    three_bar = offset + sum(len(line) + 1 for line in lines[start:start + 3]) + lines[start + 3].index("█")
    assert got[zero_bar] == YELLOW and got[three_bar] == GREEN


def test_long_accepted_runs_are_binned_so_the_panel_stays_short() -> None:
    """n-gram lookup accepts up to 64 drafts a round: lengths above 4 share doubling rows (5-8, 9-16,
    17-32, 33-64), so the histogram takes at most 9 rows, not one per length (a demo's was 47)."""
    from collections import Counter

    stats = panel_stats()
    stats.accepted_per_round = Counter({0: 3, 1: 2, 6: 1, 7: 1, 12: 2, 46: 5})
    text, _ = render(stats_panel(stats))
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if "accepted drafts per round" in line) + 1
    rows = {}
    for line in lines[start:]:
        m = re.search(r"│\s*(\d+(?:-\d+)?) (█*)\s+(\d+)", line)
        if not m:
            break
        rows[m.group(1)] = int(m.group(3))
    assert rows == {"0": 3, "1": 2, "2": 0, "3": 0, "4": 0, "5-8": 2, "9-16": 2, "17-32": 0, "33-46": 5}


def test_panel_of_a_plain_run_leaves_out_what_does_not_apply() -> None:
    stats = GenerationStats(n_generated=5, rounds=5, k_per_round=[0] * 5, generation_seconds=0.1,
                            verify_seconds=0.05, verify_by_size={1: [5, 0.05]})
    text, _ = render(stats_panel(stats))
    assert re.search(r"drafted / accepted\s+0 / 0\s+acceptance\s+n/a", text)
    assert re.search(r"predicted speedup\s+n/a", text)
    for absent in ("accepted drafts per round", "draft length k", "accepted by drafter", "stop:"):
        assert absent not in text


def test_sparkline_bins_and_scale() -> None:
    assert sparkline([]) == ""
    assert sparkline([0, 8]) == "▁█  (k 0..8, mean 4.0)"
    # 120 values into 60 bins: bin means 1 and 3 alternate with the pattern, drawn at 1/3 and full.
    line = sparkline([0, 2, 2, 4] * 30)
    bars = line.split("  ")[0]
    assert len(bars) == 60 and set(bars) == {"▃", "█"}
    assert line.endswith("(k 0..4, mean 2.0)")


def test_plain_stats_lines_carry_the_values() -> None:
    lines = dict(line.split(": ", 1) for line in stats_lines(panel_stats()).splitlines())
    assert lines["generated_tokens"] == "14" and lines["drafted"] == "14" and lines["accepted"] == "8"
    assert lines["acceptance_rate"] == str(round(8 / 14, 4))
    assert lines["stop_reason"] == "eos"
    assert "auto_reason" not in lines


def test_stats_lines_say_n_a_where_a_figure_does_not_apply_and_why_auto_held_back() -> None:
    """On a pipe a figure that does not apply (nothing drafted, no seed) is n/a, never Python's None;
    auto's reason is a line of its own when it held back."""
    from specli.events import Holdback

    stats = GenerationStats(n_generated=5, rounds=5, k_per_round=[0] * 5, generation_seconds=0.1,
                            verify_seconds=0.05, verify_by_size={1: [5, 0.05]})
    reason = "verify of 5 costs 3.1× one token here; acceptance 12 %: drafting would run at 0.80×"
    stats.observe(DoneEvent("length", "", 0.1, Holdback("declined", reason, 5, 5)))
    text = stats_lines(stats)
    assert "None" not in text
    lines = dict(line.split(": ", 1) for line in text.splitlines())
    assert lines["acceptance_rate"] == "n/a" and lines["seed"] == "n/a" and lines["auto_reason"] == reason


def test_the_panel_says_why_auto_held_back() -> None:
    from specli.events import Holdback

    stats = panel_stats()
    stats.holdback = Holdback("nothing", "ngram: nothing to copy in 57 of 64 rounds", 57, 64)
    text, _ = render(stats_panel(stats))
    assert re.search(r"auto\s+ngram: nothing to copy in 57 of 64 rounds", text)


def test_the_panel_of_a_run_without_a_draft_shows_no_drafting_rows() -> None:
    """--no-draft: no draft cost (it was "draft n/a/token"), no drafts, no verify rule (it was
    "sampling same-as-plain"); what the target's tokens cost instead."""
    stats = GenerationStats(n_generated=5, rounds=5, k_per_round=[0] * 5, generation_seconds=0.1,
                            verify_seconds=0.05, verify_by_size={1: [5, 0.05]}, sampling_mode="same-as-plain",
                            seed=3)
    text, _ = render(stats_panel(stats, drafting=False))
    for absent in ("draft ", "drafted", "acceptance", "same-as-plain", "predicted"):
        assert absent not in text, absent
    assert re.search(r"target decode\s+10\.0 ms/token", text) and re.search(r"sampling\s+sampled", text)


def test_specli_models_is_readable_at_80_columns() -> None:
    """At 80 columns the table folded each file path into a 5-character column (173 lines): there each
    model takes a line of facts and one for its file."""
    from pathlib import Path

    from specli.config import load_config, model_rows
    from specli.ui.models_table import render_models

    rows = model_rows(load_config(Path(__file__).parents[1] / "models.toml", strict=False))
    for width in (80, 200):
        console = Console(width=width, record=True)
        console.print(render_models(rows, width, title="models"))
        text = console.export_text()
        assert all(len(line) <= width for line in text.splitlines())
        assert len(text.strip().splitlines()) <= 2 * len(rows) + 6
        for row in rows:
            assert row["name"] in text and Path(row["path"]).name in text


# -- the default `specli run` view, end to end ---------------------------------------------------------------

PROMPT = "Once upon a time there was a fox. Once upon a time"
TERMINAL_ENV = {"FORCE_COLOR": "1", "TERM": "xterm-256color", "COLORTERM": "truecolor", "COLUMNS": "100"}


def api_events(fixture_models, draft, *, ngram: bool = False, k: int = 3, n: int = 24) -> list:
    params = GenerationParams(max_tokens=n, sampling=SamplingParams(temperature=0.0), draft_max=k)
    with load(fixture_models.target, draft, n_ctx=256, n_threads=1, ngram=ngram) as spec:
        return list(spec.generate(PROMPT, params))


def terminal_run(*args: str):
    # The runner's stdout is no terminal; specli asks the stream itself (FORCE_COLOR no longer makes a
    # file a terminal), so the stream's answer is what is replaced here.
    with mock.patch("specli.ui.console.is_a_terminal", return_value=True):
        result = CliRunner().invoke(app, ["run", PROMPT, "--temp", "0", "-c", "256", "-t", "1", *args],
                                    env=TERMINAL_ENV, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("mode", ["draft", "draft-show-rejected", "combined-show-rejected", "ngram"])
def test_run_on_a_terminal_colours_the_tokens_of_the_run(fixture_models, mode) -> None:
    """The default view: the legend, the prompt in bold, every token in its origin's colour (greedy
    with a fixed k, so the API run gives the same events), then the stats panel of that run."""
    combined = mode.startswith("combined")
    show_rejected = mode.endswith("show-rejected")
    draft = "ngram" if mode == "ngram" else str(fixture_models.draft)
    events = api_events(fixture_models, draft if draft == "ngram" else fixture_models.draft, ngram=combined)
    origins = Counter(e.origin for e in events if isinstance(e, TokenEvent))
    # The run must show what this test checks: accepted drafts, and corrections or rejections.
    assert origins[Origin.ACCEPTED] and origins[Origin.CORRECTED]
    if combined:
        drafters = {e.drafter for e in events if isinstance(e, TokenEvent) and e.origin is Origin.ACCEPTED}
        assert drafters == {"draft", "ngram"}, drafters

    args = ["--target", str(fixture_models.target), "--draft", draft, "-n", "24", "-k", "3"]
    args += ["--ngram"] * combined + ["--show-rejected"] * show_rejected
    result = terminal_run(*args)
    text, got = looks(result.stdout)
    want_text, want = expected_looks(events, show_rejected=show_rejected, combined=combined)
    start = text.index(PROMPT + want_text)
    assert all(look.bold for look in got[start:start + len(PROMPT)])
    shown = got[start + len(PROMPT):start + len(PROMPT) + len(want_text)]
    assert shown == want
    # The legend comes first (it may fold at the width) and names the drafters apart only in combined mode.
    before = text[:start]
    assert ("accepted (ngram)" in before) == combined and "target's correction" in before
    assert ("rejected" in before) == show_rejected

    rounds = [e for e in events if isinstance(e, RoundEvent)]
    n_tokens = sum(isinstance(e, TokenEvent) for e in events)
    drafted, accepted = sum(r.k for r in rounds), sum(r.accepted for r in rounds)
    panel = text[start + len(PROMPT) + len(want_text):]
    assert re.search(rf"tokens generated\s+{n_tokens}\s", panel)
    assert re.search(rf"rounds\s+{len(rounds)}\s+tokens/round\s+{n_tokens / len(rounds):.2f}", panel)
    acceptance = f"{100 * accepted / drafted:.1f} %"
    assert re.search(rf"drafted / accepted\s+{drafted} / {accepted}\s+acceptance\s+{acceptance}", panel)
    assert f"stop: {events[-1].stop_reason}" in panel
    assert fixture_models.target.name in panel


def test_run_through_a_pipe_writes_plain_text_and_stats_on_stderr(fixture_models) -> None:
    events = api_events(fixture_models, fixture_models.draft)
    result = CliRunner().invoke(
        app, ["run", PROMPT, "--temp", "0", "-c", "256", "-t", "1", "--target", str(fixture_models.target),
              "--draft", str(fixture_models.draft), "-n", "24", "-k", "3", "--show-rejected"],
        catch_exceptions=False)
    assert result.exit_code == 0
    assert result.stdout == events[-1].text + "\n"  # no colour codes, no prompt, no rejected drafts
    assert "\x1b[" not in result.stdout
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert f"rounds: {len(rounds)}\n" in result.stderr
    assert f"accepted: {sum(r.accepted for r in rounds)}\n" in result.stderr
