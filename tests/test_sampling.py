"""The sampling filters and the exact accept/reject rule, on numpy distributions (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from specli.drafters.base import Draft
from specli.engine import speculative_step
from specli.sampling import (
    SamplingError,
    SamplingParams,
    accept_prefix,
    greedy_token,
    process_logits,
    residual_distribution,
    sample,
)


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


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def _null_tv_threshold(p: np.ndarray, n: int, rng: np.random.Generator, quantile: float = 0.999) -> float:
    """TV distance between p and an empirical distribution of n draws from p, at a high quantile."""
    sims = rng.multinomial(n, p / p.sum(), size=400) / n
    return float(np.quantile(0.5 * np.abs(sims - p).sum(axis=1), quantile))


@pytest.mark.parametrize("proposal", ["model", "point"])
def test_first_token_follows_target_distribution_for_a_mismatched_draft(proposal: str) -> None:
    rng = np.random.default_rng(42)
    vocab, k, trials = 12, 3, 20000
    target_logits = rng.standard_normal((k + 1, vocab)).astype(np.float32) * 2
    target_logits[:, 7] = -np.inf  # a zero-mass token that the draft likes
    draft_logits = rng.standard_normal((k, vocab)).astype(np.float32) * 2
    draft_logits[:, 7] = 4.0
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    p1 = process_logits(target_logits[0], params)
    q = np.stack([process_logits(r, params) for r in draft_logits])
    assert p1[7] == 0 and q[0, 7] > 0.3
    counts = np.zeros(vocab)
    for _ in range(trials):
        if proposal == "model":
            tokens = [sample(q[i], rng) for i in range(k)]
            draft = Draft(tokens, q, "draft")
        else:
            tokens = [7, 1, 2] if rng.random() < 0.5 else [3, 3, 3]
            draft = Draft(tokens, None, "ngram")
        out, n = speculative_step(target_logits, draft, params, rng)
        counts[out[0]] += 1
    freq = counts / trials
    assert counts[7] == 0, "a token the target gives zero mass was emitted"
    threshold = _null_tv_threshold(p1, trials, np.random.default_rng(7))
    assert _tv(freq, p1) < threshold
    # The test has power: the draft's own distribution is far outside the threshold.
    if proposal == "model":
        assert _tv(q[0], p1) > 5 * threshold


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
