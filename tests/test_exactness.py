"""Exact sampling on real llama.cpp inference: the tokens speculative decoding emits follow the target's
own distribution, at positions where drafts are really made and often rejected.

Each test computes, from the target's and the draft's processed rows at the tested positions, the
exact law each plausible wrong rule would give (resampling from p or from q after a rejection, an
unnormalised residual, the bonus from the wrong row, --draft-p-min on the sampled token) and asserts
that it lies at least 3 null thresholds from the target's: the test could tell each of them from
the exact rule. Only then does it compare what the engine emitted, over many seeded generations,
with the target's distribution. Thresholds are the 0.999 quantile of TV for as many draws from p.

The rejection rule is tested (same_as_plain=False); the engine's default, same-as-plain verification,
is checked at position 1 too. Everything is seeded and nothing depends on timing: fixed k, and for
auto a fresh cost model per generation, with which the first round is plain and the second drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest
from sampling_reference import process_logits
from support import (
    BONUS_ROW,
    EXACT,
    PMIN_SAMPLED,
    POSITION_RULES,
    assert_power,
    bonus_law,
    coarse_ids,
    coarsen,
    empirical,
    free_drafting,
    next_position_law,
    position_law,
    tv,
)

from specli import GenerationParams, SamplingParams, load
from specli.api import Speculator
from specli.costs import CostModel
from specli.events import Origin, RejectedEvent, RoundEvent, TokenEvent
from specli.llama import Model, ModelOptions
from specli.policy import Learned

N_CTX = 256
UNFILTERED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
ACCEPTANCE_RANGE = (0.3, 0.7)  # drafts accepted often, and rejected often

# Prompts chosen so that the tested positions have mid-range acceptance and each wrong rule is caught
# with a wide margin (both asserted in the tests).
FIRST_PROMPT = "smiled and"  # position 1: acceptance 0.61
# Position 1 is nearly always the accepted draft " to" (so position 2 is drafted in nearly every
# generation); position 2: acceptance 0.40.
LATER_PROMPT = "happy and they went"
P_MIN_PROMPT = "bird. The"  # the draft's top probability 0.44, its second 0.34
# The prompt's last two tokens occurred before: n-gram lookup proposes the two that followed them.
NGRAM_PROMPT = "So Pip and the bird. So Pip"


@dataclass
class Trial:
    """One seeded generation: the tokens emitted, its rounds, and what each round proposed."""

    tokens: list[int] = field(default_factory=list)
    rounds: list[RoundEvent] = field(default_factory=list)
    proposals: dict[int, list[int]] = field(default_factory=dict)


def run_trials(
    spec: Speculator,
    prompt: list[int],
    trials: int,
    *,
    draft_max: int | str,
    max_tokens: int,
    costs: Callable[[], CostModel] | None = None,
    same_as_plain: bool = False,
) -> list[Trial]:
    """Generations with seeds 0..trials-1. EOG tokens are banned (ignore_eos), so every generation
    has max_tokens tokens; the reference rows ban them too. costs: auto starts from this cost model
    and nothing learned each time (its choices then do not depend on earlier generations' timings).
    same_as_plain: False (here the default) verifies by the rejection rule, which the wrong rules
    vary; True verifies drafts against the target's own keyed draw (the engine's default)."""
    out = []
    for seed in range(trials):
        if costs is not None:
            spec.engine.costs, spec.engine.learned = costs(), Learned()
        params = GenerationParams(
            max_tokens=max_tokens,
            sampling=UNFILTERED,
            seed=seed,
            draft_max=draft_max,
            ignore_eos=True,
            same_as_plain=same_as_plain,
        )
        trial = Trial()
        for e in spec.generate(prompt, params):
            if isinstance(e, TokenEvent):
                trial.tokens.append(e.token)
                if e.origin is Origin.ACCEPTED:
                    trial.proposals.setdefault(e.round, []).append(e.token)
            elif isinstance(e, RejectedEvent):
                trial.proposals.setdefault(e.round, []).extend(e.tokens)
            elif isinstance(e, RoundEvent):
                trial.rounds.append(e)
        assert len(trial.tokens) == max_tokens
        out.append(trial)
    return out


class Rows:
    """The target's p and the draft's q after a context, processed as the engine processes them."""

    def __init__(self, target: Path, draft: Path | None = None) -> None:
        opts = ModelOptions(n_ctx=N_CTX, n_threads=1)
        self.target = Model(target, opts)
        self.draft = Model(draft, opts) if draft is not None else None
        self.sampling = replace(UNFILTERED, banned=self.target.eog_tokens())

    def tokenize(self, text: str) -> list[int]:
        return self.target.tokenize(text)

    def p(self, context: Sequence[int]) -> np.ndarray:
        return self._row(self.target, context)

    def q(self, context: Sequence[int]) -> np.ndarray:
        assert self.draft is not None
        return self._row(self.draft, context)

    def _row(self, model: Model, context: Sequence[int]) -> np.ndarray:
        model.reset()
        row = model.decode(list(context), outputs="last")[0]
        return process_logits(row, self.sampling, out_width=self.target.n_vocab).astype(np.float64)

    def close(self) -> None:
        self.target.close()
        if self.draft is not None:
            self.draft.close()


@pytest.fixture(scope="module")
def rows(fixture_models) -> Iterator[Rows]:
    r = Rows(fixture_models.target, fixture_models.draft)
    yield r
    r.close()


def assert_mid_range(acceptance: float, what: str) -> None:
    low, high = ACCEPTANCE_RANGE
    assert low <= acceptance <= high, f"{what}: acceptance {acceptance:.3f} outside {ACCEPTANCE_RANGE}"


def tv_failure(tokens: Iterable[int], p: np.ndarray, wrong: dict[str, np.ndarray], what: str) -> str | None:
    """Why the emitted tokens do not follow p (None: they do), by TV over the ids that matter
    (coarse_ids: those with some mass in p or a wrong law). First asserts that each wrong rule's law
    is far enough from p to be caught with as many tokens."""
    ids = coarse_ids(p, *wrong.values())
    freq, n = empirical(tokens, p.shape[0])
    p_c = coarsen(p, ids)
    threshold = assert_power({rule: coarsen(law, ids) for rule, law in wrong.items()}, p_c, n, what)
    distance = tv(coarsen(freq, ids), p_c)
    if distance < threshold:
        return None
    return f"{what}: TV {distance:.4f} >= null threshold {threshold:.4f} (n = {n})"


def assert_no_failure(*failures: str | None) -> None:
    """All checks of a test are made before one fails, so a broken rule shows every figure it moves."""
    found = [f for f in failures if f]
    assert not found, "; ".join(found)


def unless(ok: bool, failure: str) -> str | None:
    return None if ok else failure


# ---------------------------------------------------------------------------------------------------
# a draft model
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("same_as_plain", [False, True], ids=["rejection-rule", "same-as-plain"])
def test_draft_model_first_position(fixture_models, rows: Rows, same_as_plain: bool) -> None:
    """k = 1: position 1 is the round's draft, accepted with min(1, p/q), else drawn from the residual
    (the rejection rule); or accepted when it equals the target's own keyed draw (same-as-plain, whose
    plausible wrong rule is trusting the draft: emitting q)."""
    prompt = rows.tokenize(FIRST_PROMPT)
    p1, q1 = rows.p(prompt), rows.q(prompt)
    assert_mid_range(position_law(p1, q1).acceptance, "position 1")
    if same_as_plain:
        wrong = {"the draft's token unchecked": q1}
    else:
        wrong = {rule: position_law(p1, q1, rule=rule).total for rule in POSITION_RULES}

    with load(fixture_models.target, fixture_models.draft, n_ctx=N_CTX, n_threads=1) as spec:
        trials = run_trials(spec, prompt, 1500, draft_max=1, max_tokens=2, same_as_plain=same_as_plain)
    assert_no_failure(
        tv_failure((t.tokens[0] for t in trials), p1, wrong, "position 1"),
        unless(all(t.rounds[0].k == 1 and t.rounds[0].drafter == "draft" for t in trials), "no draft"),
    )


def test_draft_model_later_position_and_bonus(fixture_models, rows: Rows) -> None:
    """k = 2, where position 1 is nearly always the accepted draft t1: position 2 given t1 (the
    round's second draft if t1 was accepted, a new round's first token otherwise), and position 3
    given that round 0 accepted t1 and the likeliest t2 (the bonus: p(. | t1 t2), not p(. | t1))."""
    prompt = rows.tokenize(LATER_PROMPT)
    p1, q1 = rows.p(prompt), rows.q(prompt)
    first = {rule: position_law(p1, q1, rule=rule) for rule in (EXACT, *POSITION_RULES)}
    t1 = int(np.argmax(first[EXACT].accepted))
    assert first[EXACT].accepted[t1] > 0.9
    p2, q2 = rows.p([*prompt, t1]), rows.q([*prompt, t1])
    second = position_law(p2, q2)
    assert_mid_range(second.acceptance, "position 2")
    wrong2 = {
        rule: next_position_law(first[rule], t1, position_law(p2, q2, rule=rule).total, p2)
        for rule in POSITION_RULES
    }
    t2 = int(np.argmax(second.accepted))
    p3 = rows.p([*prompt, t1, t2])

    with load(fixture_models.target, fixture_models.draft, n_ctx=N_CTX, n_threads=1) as spec:
        trials = run_trials(spec, prompt, 2000, draft_max=2, max_tokens=3)
    # Whether round 0 accepted both drafts is settled before the bonus is drawn: condition on it.
    bonus = [t for t in trials if t.rounds[0].accepted == 2 and t.tokens[:2] == [t1, t2]]
    assert_no_failure(
        tv_failure((t.tokens[0] for t in trials), p1, {}, "position 1"),
        tv_failure((t.tokens[1] for t in trials if t.tokens[0] == t1), p2, wrong2, f"position 2 | {t1}"),
        tv_failure((t.tokens[2] for t in bonus), p3, {BONUS_ROW: bonus_law(p3, p2, BONUS_ROW)}, "bonus"),
        unless(all(t.rounds[0].k == 2 and t.rounds[0].drafter == "draft" for t in trials), "no draft"),
    )


def test_draft_p_min_gates_on_the_top_probability(fixture_models, rows: Rows) -> None:
    """--draft-p-min stays exact only if the stop does not depend on the token the draft would
    propose. p_min sits between the draft's top probability and its second: the exact gate always
    drafts, a gate on the sampled token's q(x) drafts only the top token and biases position 1."""
    prompt = rows.tokenize(P_MIN_PROMPT)
    p1, q1 = rows.p(prompt), rows.q(prompt)
    top, second = np.sort(q1)[-2:][::-1]
    p_min = float(top + second) / 2
    exact = position_law(p1, q1, p_min=p_min)
    assert_mid_range(exact.acceptance, "position 1")
    wrong = {PMIN_SAMPLED: position_law(p1, q1, rule=PMIN_SAMPLED, p_min=p_min).total}
    wrong |= {rule: position_law(p1, q1, rule=rule, p_min=p_min).total for rule in POSITION_RULES}

    with load(
        fixture_models.target, fixture_models.draft, n_ctx=N_CTX, n_threads=1, draft_p_min=p_min
    ) as spec:
        trials = run_trials(spec, prompt, 1500, draft_max=1, max_tokens=2)
    assert_no_failure(
        tv_failure((t.tokens[0] for t in trials), p1, wrong, f"position 1, p_min {p_min:.3f}"),
        # The exact gate drafts whatever token the draft then draws.
        unless(all(t.rounds[0].k == 1 for t in trials), "p_min stopped some drafts"),
    )


def test_auto_drafts_exactly(fixture_models, rows: Rows) -> None:
    """-k auto, its gate judging each position by the draft's calibrated confidence (decided before the
    draft samples there), from costs in which drafting is free. Position 2 given t1 is drafted in every
    generation whose first token is t1: in round 0 after an accepted t1, or first in round 1 after
    the correction t1."""
    prompt = rows.tokenize(LATER_PROMPT)
    p1 = rows.p(prompt)
    t1 = int(np.argmax(p1))
    p2, q2 = rows.p([*prompt, t1]), rows.q([*prompt, t1])
    assert_mid_range(position_law(p2, q2).acceptance, "position 2")
    wrong = {rule: position_law(p2, q2, rule=rule).total for rule in POSITION_RULES}

    with load(fixture_models.target, fixture_models.draft, n_ctx=N_CTX, n_threads=1) as spec:
        trials = run_trials(spec, prompt, 1500, draft_max="auto", max_tokens=3, costs=free_drafting)
    after_t1 = [t for t in trials if t.tokens[0] == t1]
    # Drafted in round 0 (its first draft accepted, a second one drafted) or first in round 1 (round
    # 0 ended at position 1); not round 0's bonus token.
    position_2_drafted = [
        t
        for t in after_t1
        if (t.rounds[0].accepted >= 1 and t.rounds[0].k == 2)
        or (t.rounds[0].emitted == 1 and t.rounds[1].k >= 1)
    ]
    assert_no_failure(
        tv_failure((t.tokens[1] for t in position_2_drafted), p2, wrong, f"position 2 | {t1}"),
        unless(len(position_2_drafted) == len(after_t1), "auto's rounds changed: pick the position anew"),
    )


# ---------------------------------------------------------------------------------------------------
# n-gram lookup, alone and combined with the draft model
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", ["ngram", "combined"])
def test_ngram_proposals(fixture_models, rows: Rows, drafter: str) -> None:
    """A prompt that repeats: round 0 proposes the two tokens that followed the match (a point mass,
    accepted with p(x)). Position 1, position 2 given that the first proposal was emitted, and the
    bonus (position 3) when both were accepted."""
    prompt = rows.tokenize(NGRAM_PROMPT)
    draft = "ngram" if drafter == "ngram" else fixture_models.draft
    with load(fixture_models.target, draft, n_ctx=N_CTX, n_threads=1, ngram=drafter == "combined") as spec:
        trials = run_trials(spec, prompt, 2500, draft_max=2, max_tokens=3)
    proposals = {tuple(t.proposals[0]) for t in trials}
    assert len(proposals) == 1 and all(t.rounds[0].drafter == "ngram" for t in trials), proposals
    d1, d2 = next(iter(proposals))

    p1, p2, p3 = rows.p(prompt), rows.p([*prompt, d1]), rows.p([*prompt, d1, d2])
    first = {rule: position_law(p1, token=d1, rule=rule) for rule in (EXACT, *POSITION_RULES)}
    assert_mid_range(first[EXACT].acceptance, "position 1")
    assert_mid_range(position_law(p2, token=d2).acceptance, "position 2")
    second = {
        rule: next_position_law(first[rule], d1, position_law(p2, token=d2, rule=rule).total, p2)
        for rule in POSITION_RULES
    }
    # The bonus: given that round 0 accepted both proposals (decided before the bonus is drawn).
    full = [t for t in trials if t.rounds[0].accepted == 2]
    assert_no_failure(
        tv_failure(
            (t.tokens[0] for t in trials), p1, {r: first[r].total for r in POSITION_RULES}, "position 1"
        ),
        tv_failure((t.tokens[1] for t in trials if t.tokens[0] == d1), p2, second, f"position 2 | {d1}"),
        tv_failure((t.tokens[2] for t in full), p3, {BONUS_ROW: bonus_law(p3, p2, BONUS_ROW)}, "bonus"),
    )
