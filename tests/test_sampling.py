"""The sampling filters and the exact accept/reject rule, on numpy distributions (no model needed)."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import llama_cpp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from sampling_reference import accept_prefix, process_logits, residual_distribution, sample, speculative_step
from support import (
    BONUS_ROW,
    EXACT,
    PMIN_SAMPLED,
    RESAMPLE_P,
    RESAMPLE_Q,
    UNNORMALISED,
    assert_power,
    bonus_law,
    empirical,
    null_tv_threshold,
    position_law,
    tv,
)

from specli.drafters.base import Draft
from specli.sampling import SamplingError, SamplingParams, distribution, greedy_token, masked_for


def reference_process(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Straightforward full-sort implementation of llama.cpp's order: top-k, top-p, min-p, temperature."""
    x = logits.astype(np.float64)
    order = np.argsort(-x, kind="stable")
    keep = order
    if 0 < params.top_k < x.shape[0]:
        keep = keep[: params.top_k]
    if params.top_p < 1:
        z = np.exp(x[keep] - x.max())
        total = z.sum() if 0 < params.top_k < x.shape[0] else np.exp(x - x.max()).sum()
        cum = np.cumsum(z) / total
        cut = int(np.argmax(cum >= params.top_p)) + 1 if (cum >= params.top_p).any() else len(keep)
        keep = keep[:cut]
    if params.min_p > 0:
        keep = keep[x[keep] >= x.max() + np.log(params.min_p)]
    out = np.zeros_like(x)
    z = np.exp((x[keep] - x[keep].max()) / params.temperature)
    out[keep] = z / z.sum()
    return out


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=40),
        SamplingParams(temperature=1.3, top_p=0.9),
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=1.0, min_p=0.1),
        SamplingParams(temperature=1.0, top_p=0.999),  # needs more than the first candidate block
    ],
)
def test_process_logits_matches_full_sort_reference(params: SamplingParams) -> None:
    rng = np.random.default_rng(0)
    for scale in (0.5, 3.0, 8.0):
        logits = (rng.standard_normal(5000) * scale).astype(np.float32)
        got = process_logits(logits, params)
        want = reference_process(logits, params)
        assert got.dtype == np.float32
        assert abs(float(got.sum()) - 1) < 1e-5
        np.testing.assert_allclose(got, want, atol=2e-6)
        assert set(np.flatnonzero(got)) == set(np.flatnonzero(want))


def llama_cpp_process(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The probabilities llama.cpp's own sampler chain (top-k, top-p, min-p, temperature, as its
    common sampler orders them) leaves over `logits`, from its C code through the bindings."""
    n = logits.shape[0]
    rows = np.zeros(n, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
    rows["id"] = np.arange(n)
    rows["logit"] = logits
    data = (llama_cpp.llama_token_data * n)()
    ctypes.memmove(data, rows.ctypes.data, rows.nbytes)
    candidates = llama_cpp.llama_token_data_array(data, n, -1, False)
    for sampler in (
        llama_cpp.llama_sampler_init_top_k(params.top_k),
        llama_cpp.llama_sampler_init_top_p(params.top_p, 1),
        llama_cpp.llama_sampler_init_min_p(params.min_p, 1),
        llama_cpp.llama_sampler_init_temp(params.temperature),
    ):
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(candidates))
        llama_cpp.llama_sampler_free(sampler)
    left = np.frombuffer(data, dtype=rows.dtype, count=candidates.size)
    z = np.exp(left["logit"].astype(np.float64) - float(left["logit"].max()))
    out = np.zeros(n)
    out[left["id"]] = z / z.sum()
    return out


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),  # llama.cpp's defaults
        SamplingParams(temperature=1.0, top_k=40, top_p=0.5),
        SamplingParams(temperature=0.3, top_p=0.9),
        SamplingParams(temperature=1.2, top_k=100, min_p=0.01),
        SamplingParams(temperature=1.0, min_p=0.2),
    ],
)
@pytest.mark.parametrize("n", [5000, 262_144])
def test_filters_match_llama_cpps_own_sampler_chain(params: SamplingParams, n: int) -> None:
    """What `specli --no-draft` samples is what llama-cli and llama-server sample: the same support
    and probabilities as llama.cpp's C samplers leave (not only a re-implementation of their rules),
    on peaked and flat rows."""
    rng = np.random.default_rng(n)
    for scale in (0.5, 2.0, 4.0, 8.0):
        logits = (rng.standard_normal(n) * scale).astype(np.float32)
        got = distribution(logits, params).dense()
        want = llama_cpp_process(logits, params)
        np.testing.assert_allclose(got, want, atol=2e-6)
        if params.top_k or not params.top_p < 1:
            assert set(np.flatnonzero(got)) == set(np.flatnonzero(want)), scale
        else:
            # top-p alone over a flat row keeps thousands of ids, and llama.cpp sums their mass in
            # float32 (specli in float64, so the cut does not move with rounding): the cuts may be
            # a few dozen of the smallest ids apart (Gemma's vocabulary: under 1e-5 of mass).
            assert 0.5 * float(np.abs(got - want).sum()) < 1e-4, scale


@pytest.mark.parametrize("n", [262_144, 32 * 4748 + 7])  # Gemma's vocabulary; one with a ragged tail
@pytest.mark.parametrize("rows", ["normal", "ties", "flat"])
def test_large_vocabulary_filters_and_bans_match_the_reference(n: int, rows: str) -> None:
    """The candidate search over group maxima (ties at the top-k boundary, ids past the last full row,
    the top-p shortcut) and banned ids checked after the fact, against a full sort of the masked row."""
    rng = np.random.default_rng(n)
    for trial in range(12):
        x = rng.standard_normal(n) * (0.5 if rows == "flat" else 3.0)
        if rows == "ties":
            x = np.round(x * 2) / 2
            x[rng.integers(n, size=60)] = x.max()  # more ids tie at the top than top-k keeps
        if trial % 3 == 2:
            # Twenty ids near the top that share one group of the candidate search (ids n // 32
            # apart): more min-p survivors than top-k keeps, in fewer groups than top-k.
            near_top = int(rng.integers(n // 32)) + np.arange(20) * (n // 32)
            x[near_top] = x.max() - np.linspace(0.0, 0.5, 20)
        x = x.astype(np.float32)
        banned = tuple(int(t) for t in rng.integers(n, size=2))
        if trial % 2:
            banned += (int(np.argmax(x)), int(np.argsort(-x, kind="stable")[5]))  # banned winners
        masked = x.copy()
        masked[list(banned)] = -np.inf
        assert greedy_token(x, banned) == int(np.argmax(masked))
        for params in (
            SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
            SamplingParams(temperature=1.0, top_k=40, top_p=0.5),
            SamplingParams(temperature=1.0, top_k=100, min_p=0.01),
            SamplingParams(temperature=1.0, top_k=40),
            SamplingParams(temperature=1.0, top_k=5, top_p=0.95, min_p=0.05),
        ):
            want = reference_process(masked, params)
            got = distribution(x, replace(params, banned=banned)).dense()
            assert set(np.flatnonzero(got)) == set(np.flatnonzero(want)), (trial, params)
            np.testing.assert_allclose(got, want, atol=2e-6)
            assert masked_for(x[None, :], replace(params, banned=banned)).banned == banned  # no mask needed
        np.testing.assert_array_equal(x[list(banned)] > -np.inf, True)  # the row was not touched


def test_a_banned_id_among_the_top_k_is_left_out_of_top_p_mass() -> None:
    """A banned id that top-k would keep but min-p drops still counts in the top-k mass top-p
    normalises by, unless it is masked first: llama.cpp masks first, so must we. Here the unmasked
    mass keeps two tokens and the masked one keeps only the first."""
    n = 262_144
    x = np.full(n, -20.0, dtype=np.float32)
    best, second, banned = 1000, 200_000, 77_777
    x[best], x[second], x[banned] = 10.0, 10.0 + np.log(0.06), 10.0 + np.log(0.049)
    params = SamplingParams(temperature=1.0, top_k=40, top_p=0.92, min_p=0.05)
    masked = x.copy()
    masked[banned] = -np.inf
    want = reference_process(masked, params)
    assert set(np.flatnonzero(want)) == {best}
    got = distribution(x, replace(params, banned=(banned,))).dense()
    assert set(np.flatnonzero(got)) == {best}
    np.testing.assert_allclose(got, want, atol=2e-6)


def test_process_logits_pads_and_cuts_to_target_width() -> None:
    logits = np.array([0.0, 1.0, 2.0, 3.0], dtype=np.float32)
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    padded = process_logits(logits, p, out_width=6)
    assert padded.shape == (6,) and padded[4:].sum() == 0
    cut = process_logits(logits, p, out_width=3)
    assert cut.shape == (3,) and abs(cut.sum() - 1) < 1e-6 and cut[2] > cut[1]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_logits_are_refused(bad: float) -> None:
    logits = np.zeros(10, dtype=np.float32)
    logits[3] = bad
    with pytest.raises(SamplingError):
        process_logits(logits, SamplingParams(temperature=1.0))
    with pytest.raises(SamplingError):
        greedy_token(logits)


def test_masked_logits_are_fine() -> None:
    logits = np.full(10, -np.inf, dtype=np.float32)
    logits[[2, 5]] = [1.0, 2.0]
    p = process_logits(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
    assert set(np.flatnonzero(p)) == {2, 5}


def test_greedy_ties_go_to_lowest_id() -> None:
    assert greedy_token(np.array([0.0, 5.0, 5.0, 1.0], dtype=np.float32)) == 1


def test_sample_follows_distribution_and_never_zero_mass() -> None:
    rng = np.random.default_rng(1)
    p = np.array([0.0, 0.5, 0.0, 0.3, 0.2, 0.0], dtype=np.float32)
    draws = np.array([sample(p, rng) for _ in range(20000)])
    freq = np.bincount(draws, minlength=6) / draws.size
    assert freq[[0, 2, 5]].sum() == 0
    assert np.abs(freq - p).max() < 0.015


def test_accept_prefix() -> None:
    p = np.array([0.5, 0.2, 0.9])
    q = np.array([0.5, 0.4, 0.3])
    assert accept_prefix(p, q, np.array([0.99, 0.0, 0.0])) == 3  # ratio >= 1 always accepts
    assert accept_prefix(p, q, np.array([0.1, 0.6, 0.0])) == 1  # 0.6 >= 0.2/0.4
    assert accept_prefix(p, q, np.array([0.1, 0.4, 0.5])) == 3
    assert accept_prefix(np.array([0.0]), np.array([0.2]), np.array([0.0])) == 0  # p = 0 always rejects


def test_residual_distribution() -> None:
    p = np.array([0.1, 0.6, 0.3], dtype=np.float32)
    q = np.array([0.5, 0.2, 0.3], dtype=np.float32)
    r = residual_distribution(p, q, 0)
    np.testing.assert_allclose(r, [0.0, 1.0, 0.0], atol=1e-6)
    point = residual_distribution(p, None, 1)  # point-mass proposal: p without the rejected token
    np.testing.assert_allclose(point, [0.25, 0.0, 0.75], atol=1e-6)


# -- the exact rule, statistically ------------------------------------------------------------------
# speculative_step on fixed synthetic rows, against the exact law of every position it emits, and the
# same statistic applied to the plausible wrong rules (implemented below) must fail for each of them.

UNFILTERED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
STEP_TRIALS = 8000
ZERO_MASS = 7  # a token the target never emits and the draft likes


def _synthetic_rows(k: int = 3, vocab: int = 12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(target logits (k + 1, vocab), target p, draft q (k, vocab)): q is p blurred, so that about
    half the draft tokens pass (acceptance 0.67, 0.64, 0.51); the draft gives ZERO_MASS some mass."""
    rng = np.random.default_rng(116)
    target_logits = rng.standard_normal((k + 1, vocab)).astype(np.float32) * 2
    draft_logits = (target_logits[:k] + rng.standard_normal((k, vocab)) * 1.5).astype(np.float32)
    target_logits[:, ZERO_MASS] = -np.inf
    draft_logits[:, ZERO_MASS] = 1.0
    p = np.stack([process_logits(r, UNFILTERED) for r in target_logits])
    q = np.stack([process_logits(r, UNFILTERED) for r in draft_logits])
    return target_logits, p, q


# The wrong rules: each replaces one piece of the exact step. A replacement draw takes
# (p row, q row or None for a point mass, rejected token, rng).


def _exact_replacement(p: np.ndarray, q: np.ndarray | None, token: int, rng: np.random.Generator) -> int:
    return sample(residual_distribution(p, q, token), rng)


def _replacement_from_p(p: np.ndarray, q: np.ndarray | None, token: int, rng: np.random.Generator) -> int:
    return sample(p, rng)


def _replacement_from_q(p: np.ndarray, q: np.ndarray | None, token: int, rng: np.random.Generator) -> int:
    return token if q is None else sample(q, rng)


def _replacement_unnormalised(
    p: np.ndarray, q: np.ndarray | None, token: int, rng: np.random.Generator
) -> int:
    if q is None:
        r = p.copy()
        r[token] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    # The residual's CDF searched with a uniform on [0, 1), as if r summed to 1; an overshoot is
    # clamped to the last id with mass (as specli's sampler does).
    idx = min(int(np.searchsorted(np.cumsum(r), rng.random(), side="right")), r.shape[0] - 1)
    while r[idx] == 0 and idx > 0:
        idx -= 1
    return idx


def _rule_step(
    p: np.ndarray,
    draft: Draft,
    rng: np.random.Generator,
    replacement=_exact_replacement,
    bonus_offset: int = 0,
) -> list[int]:
    """The accept/reject round written out token by token, with a pluggable replacement draw and
    bonus row (bonus_offset -1: the bonus drawn from the last draft position's row)."""
    out = []
    for i, token in enumerate(draft.tokens):
        q_i = draft.probs[i] if draft.probs is not None else None
        q_x = q_i[token] if q_i is not None else 1.0
        if rng.random() * q_x < p[i, token]:
            out.append(token)
            continue
        out.append(replacement(p[i], q_i, token, rng))
        return out
    k = len(draft.tokens)
    out.append(sample(p[k + bonus_offset], rng))
    return out


WRONG_STEPS = {
    RESAMPLE_P: lambda p, d, rng: _rule_step(p, d, rng, _replacement_from_p),
    RESAMPLE_Q: lambda p, d, rng: _rule_step(p, d, rng, _replacement_from_q),
    UNNORMALISED: lambda p, d, rng: _rule_step(p, d, rng, _replacement_unnormalised),
    BONUS_ROW: lambda p, d, rng: _rule_step(p, d, rng, bonus_offset=-1),
}


def _position_laws(p: np.ndarray, q: np.ndarray, point: list[int] | None, rule: str) -> list[np.ndarray]:
    """The exact law of out[i] given that the round reached position i (i = 0..k; k: the bonus).
    The rows do not depend on the path, so position i's law is its own position law."""
    k = q.shape[0]
    laws = [
        position_law(p[i], None if point else q[i], token=point[i] if point else None, rule=rule).total
        for i in range(k)
    ]
    return [*laws, bonus_law(p[k], p[k - 1], rule)]


def _run_steps(step, p: np.ndarray, q: np.ndarray, point: list[int] | None, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    k = q.shape[0]
    outs = []
    for _ in range(STEP_TRIALS):
        if point:
            draft = Draft(list(point), None, "ngram")
        else:
            draft = Draft([sample(q[i], rng) for i in range(k)], q, "draft")
        outs.append(step(draft, rng))
    return outs


def _position_tvs(outs: list[list[int]], laws: list[np.ndarray]) -> list[tuple[float, float, int]]:
    """(TV to the law, null threshold, draws) for out[i] of the rounds that reached position i."""
    result = []
    for i, law in enumerate(laws):
        freq, n = empirical((o[i] for o in outs if len(o) > i), law.shape[0])
        result.append((tv(freq, law), null_tv_threshold(law, n), n))
    return result


@pytest.mark.parametrize("proposal", ["model", "point"])
def test_every_position_follows_the_target_and_wrong_rules_are_caught(proposal: str) -> None:
    target_logits, p, q = _synthetic_rows()
    k = q.shape[0]
    # Point-mass proposals (n-gram lookup): the target's likeliest token, which it takes about half the time.
    point = [int(np.argmax(row)) for row in p[:k]] if proposal == "point" else None
    exact = _position_laws(p, q, point, EXACT)
    for i in range(k):  # acceptance mid-range where it matters, so rejections are frequent
        acceptance = position_law(p[i], None if point else q[i], token=point[i] if point else None).acceptance
        assert 0.3 <= acceptance <= 0.7, (i, acceptance)

    outs = _run_steps(lambda d, rng: speculative_step(target_logits, d, UNFILTERED, rng)[0], p, q, point, 1)
    assert all(o[0] != ZERO_MASS for o in outs), "a token the target gives zero mass was emitted"
    for i, (distance, threshold, n) in enumerate(_position_tvs(outs, exact)):
        assert n >= 800, (i, n)  # the bonus position too is reached often enough to be tested
        assert distance < threshold, f"position {i}: TV {distance:.4f} >= null threshold {threshold:.4f}"

    for rule, step in WRONG_STEPS.items():
        laws = _position_laws(p, q, point, rule)
        wrong = _run_steps(lambda d, rng, step=step: step(p, d, rng), p, q, point, 1)
        tvs = _position_tvs(wrong, exact)
        # Power in closed form: at some position the wrong law is >= 3 null thresholds from the exact one.
        assert max(tv(law, want) / t for law, want, (_, t, _) in zip(laws, exact, tvs, strict=True)) >= 3, (
            rule
        )
        # The same statistic that passes the engine fails the wrong rule.
        assert any(d >= t for d, t, _ in tvs), f"{rule} passed: {tvs}"
        # And the closed form (which the real-model tests rely on) is the wrong rule's law.
        for i, (distance, threshold, _) in enumerate(_position_tvs(wrong, laws)):
            assert distance <= threshold, f"{rule}, position {i}: closed form off by TV {distance:.4f}"


def test_p_min_must_gate_on_the_top_probability() -> None:
    """A drafter that stops on p_min before drawing (top probability) keeps position 1 exact; one that
    stops after drawing, on the drawn token's q(x), biases it, and the closed form says by how much."""
    target_logits, p, q = _synthetic_rows(k=1)
    p_min = float(np.sort(q[0])[-2]) + 1e-6  # the draft's top token passes, the others do not
    exact = position_law(p[0], q[0], p_min=p_min).total
    wrong = position_law(p[0], q[0], rule=PMIN_SAMPLED, p_min=p_min).total
    np.testing.assert_allclose(exact, p[0], atol=1e-6)  # the top-probability gate leaves p intact

    def drafted(rng: np.random.Generator, on_sampled: bool) -> list[int]:
        token = sample(q[0], rng)
        stop = q[0, token] < p_min if on_sampled else q[0].max() < p_min
        draft = Draft.empty("draft") if stop else Draft([token], q, "draft")
        return speculative_step(target_logits[: len(draft.tokens) + 1], draft, UNFILTERED, rng)[0]

    rng = np.random.default_rng(3)
    right = empirical((drafted(rng, False)[0] for _ in range(STEP_TRIALS)), p.shape[1])
    biased = empirical((drafted(rng, True)[0] for _ in range(STEP_TRIALS)), p.shape[1])
    threshold = assert_power({PMIN_SAMPLED: wrong}, p[0], STEP_TRIALS, "p_min")
    assert tv(right[0], p[0]) < threshold
    assert tv(biased[0], p[0]) >= threshold
    assert tv(biased[0], wrong) < threshold


def test_accepting_on_the_ratio_needs_no_min() -> None:
    """'u < p/q' and 'u < min(1, p/q)' are one rule for u in [0, 1): a ratio above 1 accepts either
    way. (So "accept with p/q without the min" is not a distinct wrong rule; accept_prefix uses it.)"""
    rng = np.random.default_rng(0)
    p, q, u = rng.random(10000), rng.random(10000), rng.random(10000)
    with_min = u < np.minimum(1.0, p / q)
    for i in range(0, 10000, 500):
        assert accept_prefix(p[i : i + 1], q[i : i + 1], u[i : i + 1]) == int(with_min[i])


def test_greedy_step_accepts_while_draft_equals_argmax() -> None:
    rows = np.full((4, 6), -1.0, dtype=np.float32)
    for i, best in enumerate([2, 4, 1, 5]):
        rows[i, best] = 3.0
    greedy = SamplingParams(temperature=0.0)
    rng = np.random.default_rng(0)
    assert speculative_step(rows, Draft([2, 4, 0], None, "d"), greedy, rng) == ([2, 4, 1], 2)
    assert speculative_step(rows, Draft([2, 4, 1], None, "d"), greedy, rng) == ([2, 4, 1, 5], 3)
    assert speculative_step(rows, Draft([3, 4, 1], None, "d"), greedy, rng) == ([2], 0)
    assert speculative_step(rows[:1], Draft([], None, "plain"), greedy, rng) == ([2], 0)


# -- property-based: degenerate and random distributions --------------------------------------------

_finite_logits = arrays(np.float32, st.integers(2, 64), elements=st.floats(-30, 30, width=32))


@settings(max_examples=200, deadline=None)
@given(
    logits=_finite_logits,
    temp=st.floats(0.05, 3.0),
    top_k=st.integers(0, 70),
    top_p=st.floats(0.01, 1.0),
    min_p=st.floats(0.0, 1.0),
)
def test_processed_rows_are_distributions(logits, temp, top_k, top_p, min_p) -> None:
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p)
    p = process_logits(logits, params)
    assert np.all(p >= 0) and abs(float(p.sum()) - 1) < 1e-4
    assert p[int(np.argmax(logits))] > 0  # the most likely token always survives the filters
    token = sample(p, np.random.default_rng(0))
    assert p[token] > 0


@settings(max_examples=200, deadline=None)
@given(
    rows=arrays(np.float32, st.tuples(st.integers(1, 5), st.just(8)), elements=st.floats(-20, 20, width=32)),
    seed=st.integers(0, 2**16),
    point=st.booleans(),
)
def test_speculative_step_never_emits_zero_mass_tokens(rows, seed, point) -> None:
    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
    k = rows.shape[0] - 1
    q = np.stack([process_logits(r[::-1].copy(), params) for r in rows[:k]]) if k else None
    tokens = [sample(q[i], rng) for i in range(k)] if q is not None else []
    draft = Draft(tokens, None if point else q, "d")
    out, n = speculative_step(rows, draft, params, rng)
    assert len(out) == n + 1 and 0 <= n <= k
    for i, token in enumerate(out):
        assert process_logits(rows[i], params)[token] > 0
