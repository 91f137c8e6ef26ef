"""Backend sampling: the filters run in llama.cpp's graph (`--sampling-on backend`) and only their
survivors cross to Python, where the keyed draw, the acceptance rule and same-as-plain run unchanged.

The key exactness checks of test_seeds and test_exactness, run with the filters in the graph: the
survivors are the host's filters' on the same rows, same-as-plain prints plain decoding's tokens, a
seed pins the output whatever k, and the rejection rule's first position follows the target's
filtered distribution (and could tell the plausible wrong rules from it).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from support import (
    POSITION_RULES,
    assert_one_line_error,
    assert_power,
    coarse_ids,
    coarsen,
    empirical,
    position_law,
    specli,
    tv,
)

from specli import GenerationParams, SamplingParams, engine, load
from specli.engine import sampling_path
from specli.llama import FILTERED_ROWS, ArgmaxRows, GraphFilters, LlamaError, Model, ModelOptions
from specli.sampling import Noise, Survivors, distribution, greedy_token

DEFAULTS = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
FILTERED = [
    DEFAULTS,
    SamplingParams(temperature=1.0, top_k=20),
    SamplingParams(temperature=1.0, top_k=40, top_p=0.9),
    SamplingParams(temperature=0.7, top_k=100, min_p=0.1),
    SamplingParams(temperature=1.0, top_k=5, top_p=0.5, min_p=0.2),
]
PROMPT = "Once upon a time"
REPEATING = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat"


def run(spec, prompt: str, **kw):
    return spec.generate(prompt, GenerationParams(**kw)).complete()


@pytest.fixture(scope="module")
def target(fixture_models):
    with Model(fixture_models.target, ModelOptions(n_ctx=512, n_threads=1)) as model:
        yield model


def verify_rows(model: Model, prompt: str, filters: GraphFilters | None) -> tuple[np.ndarray, object]:
    """The raw rows of a 9-token batch after the prompt, and (with filters) the same batch's rows
    filtered in the graph."""
    context = model.tokenize(prompt)
    batch = [*context[-1:], *model.tokenize(" the little bird said hello to the", add_special=False)[:8]]
    model.reset()
    model.decode(context[:-1], outputs="none")
    kept = model.n_past
    raw = model.decode(batch, outputs="all").copy()
    if filters is None:
        return raw, None
    model.truncate(kept)
    model.set_filters(filters)
    return raw, model.decode_filtered(batch)


@pytest.mark.parametrize("params", FILTERED, ids=lambda p: f"k{p.top_k}-p{p.top_p}-m{p.min_p}")
@pytest.mark.parametrize("banned", [False, True], ids=["", "banned"])
def test_the_graph_keeps_what_the_host_filters_keep(target: Model, params: SamplingParams, banned: bool):
    """Every row of a verify batch: the survivors llama.cpp's graph hands over are the ids the host's
    filters keep, with the same logits, so the Dist, and each keyed draw, is the same."""
    if banned:  # the likeliest ids of the first rows, as --ignore-eos bans end-of-text
        params = replace(params, banned=(*target.eog_tokens(), 31, 32))
    filters, _ = GraphFilters.of(params, target.n_vocab)
    raw, filtered = verify_rows(target, PROMPT, filters)
    assert len(filtered) == raw.shape[0] and filtered.width == target.n_vocab
    for i in range(raw.shape[0]):
        host = distribution(raw[i].copy(), params)
        ids, logits = filtered.survivors(i)
        graph = distribution(Survivors(ids, logits), params.unbanned, width=target.n_vocab)
        assert sorted(ids.tolist()) == sorted(host.ids.tolist()), i
        np.testing.assert_array_equal(graph.dense(), host.dense())
        for seed in range(3):
            assert graph.draw(Noise(seed), 7) == host.draw(Noise(seed), 7)


def test_greedy_rows_cross_as_their_argmax(target: Model) -> None:
    """Greedy: llama.cpp's greedy sampler in the graph (ggml's argmax, not a top-k 1 that sorts the row
    on CUDA) chooses each row's id, the host's argmax, with the row's maximum as its logit and as its
    one survivor; with banned ids the best id not banned (the bias comes before the argmax)."""
    assert GraphFilters(1).argmax and not GraphFilters(2).argmax
    raw, filtered = verify_rows(target, PROMPT, GraphFilters(1))
    assert isinstance(filtered, ArgmaxRows)
    expected = [(int(r.argmax()), float(r.max())) for r in raw]
    assert [filtered.token(i) for i in range(len(filtered))] == expected
    for i in range(len(filtered)):
        ids, logits = filtered.survivors(i)
        assert ids.tolist() == [int(raw[i].argmax())] and logits.tolist() == [float(raw[i].max())]
    banned = tuple({int(r.argmax()) for r in raw[:3]})
    raw, filtered = verify_rows(target, PROMPT, GraphFilters(1, banned=banned))
    assert [filtered.token(i)[0] for i in range(len(filtered))] == [greedy_token(r, banned) for r in raw]


def test_a_raw_decode_after_a_filtered_one_is_fresh(target: Model) -> None:
    """llama.cpp leaves the raw rows stale while every output is filtered: a decode that asks for raw
    rows takes the filters off first, and gets the rows a model without them gets."""
    raw, _ = verify_rows(target, PROMPT, GraphFilters.of(DEFAULTS, target.n_vocab)[0])
    again = target.decode(target.tokenize(" x", add_special=False), outputs="last")  # detaches
    assert np.isfinite(again).all()
    raw_again, _ = verify_rows(target, PROMPT, None)
    np.testing.assert_array_equal(raw_again, raw)
    target.set_filters(None)
    with pytest.raises(LlamaError, match="needs filters"):
        target.decode_filtered([1])


def test_a_verify_batch_may_have_filtered_rows_up_to_the_limit(target: Model, fixture_models) -> None:
    """The longest round -k allows (FILTERED_ROWS rows), and a context whose batch is shorter takes
    as many as its batch; the engine drafts no more than that."""
    target.reset()
    target.set_filters(GraphFilters(1))
    rows = target.decode_filtered([5] * FILTERED_ROWS)
    assert len(rows) == FILTERED_ROWS == target.filtered_rows
    with pytest.raises(ValueError, match="at most"):
        target.decode_filtered([5] * (FILTERED_ROWS + 1))
    target.set_filters(None)
    target.reset()
    with load(fixture_models.target, fixture_models.draft, n_ctx=20, n_threads=1) as spec:
        assert spec.target.filtered_rows == spec.target.n_batch == 20
        gen = run(spec, PROMPT, seed=1, max_tokens=60, draft_max=40, sampling=DEFAULTS, sampling_on="backend")
        assert gen.stats.sampling_path == "backend" and max(gen.stats.k_per_round) == 19


def test_where_the_filters_run(target: Model) -> None:
    """auto: the host, on any device; backend when asked and the settings start with top-k (or are greedy);
    the host otherwise, with the reason."""
    assert sampling_path(target, DEFAULTS, "auto")[0] is None
    assert sampling_path(target, SamplingParams(temperature=0.0), "auto")[0] is None
    assert sampling_path(target, DEFAULTS, "host")[0] is None
    assert sampling_path(target, DEFAULTS, "backend")[0] == GraphFilters(40, 0.95, 0.05)
    assert sampling_path(target, SamplingParams(temperature=0.0), "backend")[0] == GraphFilters(1)
    filters, why = sampling_path(target, SamplingParams(temperature=1.0, top_p=0.9), "backend")
    assert filters is None and "top-k" in why
    filters, why = sampling_path(target, SamplingParams(temperature=1.0, top_k=10, min_p=1.0), "backend")
    assert filters is None and "min-p" in why


@pytest.mark.parametrize("sampling", [DEFAULTS, SamplingParams(temperature=0.0)], ids=["defaults", "greedy"])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_same_as_plain_prints_plain_tokens_with_the_filters_in_the_graph(fixture_models, drafter, sampling):
    """With the filters in the graph (target and draft model), speculation at every k prints what plain
    decoding prints, which is what plain decoding with the host's filters prints; the stats say so."""
    seeds = range(4)
    prompt = REPEATING if drafter == "ngram" else PROMPT
    common = dict(max_tokens=40, sampling=sampling, ignore_eos=True)
    with load(fixture_models.target, None, n_ctx=512, n_threads=1) as spec:
        host = {s: run(spec, prompt, seed=s, sampling_on="host", **common).tokens for s in seeds}
        graph = {}
        for s in seeds:
            gen = run(spec, prompt, seed=s, sampling_on="backend", **common)
            assert gen.stats.sampling_path == "backend" and gen.stats.as_dict()["sampling"] == "backend"
            graph[s] = gen.tokens
    assert graph == host
    draft = "ngram" if drafter == "ngram" else fixture_models.draft
    for k in (1, 3, 8, "auto"):
        drafted = accepted = 0
        with load(fixture_models.target, draft, n_ctx=512, n_threads=1) as spec:
            for s in seeds:
                gen = run(spec, prompt, seed=s, draft_max=k, sampling_on="backend", **common)
                assert gen.tokens == host[s], f"k={k} seed={s}"
                assert gen.stats.sampling_path == "backend"
                drafted += gen.stats.drafted
                accepted += gen.stats.accepted
            if drafter == "model":  # the draft model's rows were filtered in its graph too
                assert spec.drafter.model.filters is not None
        if k != "auto":  # drafts were made (and some accepted, but n-gram's after greedy text here)
            assert drafted > 0 and (accepted > 0 or sampling.greedy and drafter == "ngram"), (k, drafted)


def test_drafts_filtered_in_their_graph_beside_a_target_filtered_on_the_host(fixture_models, monkeypatch):
    """auto on a GPU: the target's rows on the host, a drafter's in its own graph (engine.drafts_in_graph,
    made to answer as on a GPU here). Same-as-plain still prints plain decoding's tokens at every k, and
    the draft model's rows were filtered in its graph; on this CPU auto leaves drafts on the host."""
    with load(fixture_models.target, None, n_ctx=512, n_threads=1) as spec:
        assert not engine.drafts_in_graph(spec.target, DEFAULTS, "auto")  # a CPU
        assert engine.drafts_in_graph(spec.target, DEFAULTS, "backend")
        assert not engine.drafts_in_graph(spec.target, DEFAULTS, "host")
        assert not engine.drafts_in_graph(spec.target, SamplingParams(temperature=1.0, top_k=0), "backend")
        common = dict(max_tokens=40, ignore_eos=True, sampling=DEFAULTS)
        plain = {s: run(spec, PROMPT, seed=s, **common).tokens for s in range(3)}
    as_on_a_gpu = engine.drafts_in_graph
    monkeypatch.setattr(engine, "drafts_in_graph", lambda target, sampling, choice: as_on_a_gpu(
        target, sampling, "backend" if choice == "auto" else choice))
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        for k in (1, 4, "auto"):
            drafted = 0
            for s in range(3):
                gen = run(spec, PROMPT, seed=s, draft_max=k, **common)
                assert gen.tokens == plain[s], (k, s)
                assert gen.stats.sampling_path == "host"
                assert spec.drafter.model.filters is not None
                drafted += gen.stats.drafted
            assert drafted > 0 or k == "auto"


def test_a_seed_pins_the_output_whatever_k_with_the_filters_in_the_graph(fixture_models) -> None:
    """The rejection rule too: a seed at a fixed k reproduces its run; same-as-plain's runs are one
    text for every k."""
    common = dict(max_tokens=40, sampling=DEFAULTS, seed=99, sampling_on="backend")
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        runs = [run(spec, PROMPT, draft_max=k, **common).tokens for k in (0, 1, 2, 5, 12, "auto")]
        rejection = [run(spec, PROMPT, draft_max=3, same_as_plain=False, **common).tokens for _ in range(2)]
    assert all(r == runs[0] for r in runs)
    assert rejection[0] == rejection[1]


# Position 1 after this prompt: the draft model's filtered q and the target's filtered p overlap by
# about half (asserted), and each wrong rule's law is far from p.
EXACT_PROMPT = "smiled and"
EXACT_SAMPLING = SamplingParams(temperature=1.0, top_k=20, top_p=0.95, min_p=0.02)


def test_the_rejection_rule_follows_the_filtered_target_with_the_filters_in_the_graph(fixture_models) -> None:
    """k = 1 by the rejection rule, every row filtered in the graph: the first token follows the
    target's filtered p (total variation under the 0.999 null threshold), which the wrong rules'
    laws would not."""
    n = 1500
    with Model(fixture_models.target, ModelOptions(n_ctx=256, n_threads=1)) as t, \
            Model(fixture_models.draft, ModelOptions(n_ctx=256, n_threads=1)) as d:
        sampling = replace(EXACT_SAMPLING, banned=t.eog_tokens())
        prompt = t.tokenize(EXACT_PROMPT)
        p = distribution(t.decode(prompt, outputs="last")[0].copy(), sampling).dense().astype(np.float64)
        q = distribution(d.decode(prompt, outputs="last")[0].copy(), sampling).dense().astype(np.float64)
    law = position_law(p, q)
    assert 0.3 <= law.acceptance <= 0.7, law.acceptance
    wrong = {rule: position_law(p, q, rule=rule).total for rule in POSITION_RULES}
    firsts = []
    with load(fixture_models.target, fixture_models.draft, n_ctx=256, n_threads=1) as spec:
        for seed in range(n):
            gen = run(spec, EXACT_PROMPT, seed=seed, max_tokens=2, draft_max=1, same_as_plain=False,
                      sampling=EXACT_SAMPLING, ignore_eos=True, sampling_on="backend")
            assert gen.stats.sampling_path == "backend" and gen.stats.rounds and gen.stats.drafted >= 1
            firsts.append(gen.tokens[0])
    ids = coarse_ids(p, *wrong.values())
    freq, _ = empirical(firsts, p.shape[0])
    threshold = assert_power({r: coarsen(w, ids) for r, w in wrong.items()}, coarsen(p, ids), n, "position 1")
    assert tv(coarsen(freq, ids), coarsen(p, ids)) < threshold


def test_the_setting_on_the_command_line(fixture_models, tmp_path) -> None:
    """--sampling-on backend|host|auto; --json says where the filters ran; a wrong value is a one-line
    usage error."""
    args = ["run", "-m", str(fixture_models.target), "--no-draft", "-n", "8", "-s", "3", "--json", PROMPT]
    out = {}
    for where in ("backend", "host", "auto"):
        proc = specli(*args, "--sampling-on", where, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        out[where] = doc["tokens"]
        assert doc["stats"]["sampling"] == ("backend" if where == "backend" else "host")
    assert out["backend"] == out["host"] == out["auto"]
    proc = specli(*args, "--sampling-on", "gpu", cwd=tmp_path)
    assert_one_line_error(proc, 2, "--sampling-on", "auto, backend or host")
