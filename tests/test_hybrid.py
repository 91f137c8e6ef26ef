"""Hybrid (recurrent + attention) models on real llama.cpp inference: LFM2 fixtures written by
specli_synth.hybrid. Rollback through llama.cpp's n_rs_seq state snapshots (targets) and state
checkpoints (drafts), greedy equality with plain decoding, the sampling distribution, the rollback
bound, the refusal, and interrupts at any point."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from sampling_reference import process_logits
from support import free_drafting, interrupt_on_line

from specli import GenerationParams, SamplingParams, TokenEvent, load
from specli.drafters.model import DraftModelDrafter
from specli.drafters.registry import DRAFT_MODEL
from specli.engine import SpeculativeEngine
from specli.events import RoundEvent
from specli.llama import Model, ModelOptions, RollbackError
from specli_synth.hybrid import HybridFixtureModels, build_hybrid_fixture_models

PROMPT = "Once upon a time"
GREEDY = SamplingParams(temperature=0.0)
OPTS = ModelOptions(n_ctx=512, n_threads=1)


@pytest.fixture(scope="session")
def hybrid_models(tmp_path_factory: pytest.TempPathFactory) -> HybridFixtureModels:
    return build_hybrid_fixture_models(tmp_path_factory.mktemp("hybrid-models"))


def tokens_of(events) -> list[int]:
    return [e.token for e in events if isinstance(e, TokenEvent)]


def plain_greedy(model_path: Path, prompt: str, n: int) -> list[int]:
    """Reference: the model's own greedy decoding, one token per llama_decode, no engine involved."""
    with Model(model_path, OPTS) as m:
        rows = m.decode(m.tokenize(prompt), outputs="last")
        out = []
        for _ in range(n):
            t = int(np.argmax(rows[0]))
            if m.is_eog(t):
                break
            out.append(t)
            rows = m.decode([t], outputs="last")
        return out


def test_lfm2_fixture_is_a_hybrid_with_rollback(hybrid_models) -> None:
    with Model(hybrid_models.target, OPTS) as m:
        assert m.architecture == "lfm2" and m.is_recurrent
        assert m.rs_seq == OPTS.max_rollback == m.max_rollback
        assert m.n_layer_nextn == 0
        # The conv state matters: the logits after "a b" and after "c b" differ.
        a = m.decode([1, 300, 400], outputs="last").copy()
        m.reset()
        b = m.decode([1, 301, 400], outputs="last").copy()
        assert np.abs(a - b).max() > 0.05


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
@pytest.mark.parametrize("depth", [1, 2, 4, 7])
def test_snapshot_rollback_gives_the_logits_of_a_fresh_evaluation(hybrid_models, depth, arch) -> None:
    path = hybrid_models.target if arch == "lfm2" else hybrid_models.qwen35
    with Model(path, OPTS) as m, Model(path, OPTS) as fresh:
        assert m.architecture == arch and m.rs_seq == OPTS.max_rollback
        prompt = m.tokenize(PROMPT)
        m.decode(prompt, outputs="none")
        batch = [300 + i for i in range(8)]  # a verify batch: pending token + 7 drafts
        m.decode(batch, outputs="all")
        keep = len(prompt) + len(batch) - depth
        assert m.can_truncate(keep)
        m.truncate(keep)
        after = m.decode([42], outputs="last").copy()
        reference = fresh.decode([*prompt, *batch[: len(batch) - depth], 42], outputs="last").copy()
        assert m.tokens == [*prompt, *batch[: len(batch) - depth], 42]
        np.testing.assert_allclose(after, reference, rtol=1e-4, atol=1e-4)
        assert llama_cpp.llama_memory_seq_pos_max(m._mem, 0) + 1 == m.n_past


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_llama_cpp_snapshots_reach_only_into_the_last_batch(hybrid_models, arch) -> None:
    """Measured: llama.cpp accepts a rollback of the whole last batch (depth <= n_rs_seq), but the
    snapshot it restores is stale (slot `depth` is written only by batches longer than depth), so the
    logits are wrong. specli's snapshot room is the last batch's length - 1."""
    path = hybrid_models.target if arch == "lfm2" else hybrid_models.qwen35
    with Model(path, OPTS) as m, Model(path, OPTS) as fresh:
        prompt = m.tokenize(PROMPT)
        m.decode(prompt, outputs="none")
        m.decode([300, 301, 302], outputs="all")
        n = len(prompt)
        assert m._rollback_room == 2  # (private: what the last batch lets truncate() drop)
        # What llama.cpp itself does when asked to drop the whole batch:
        assert llama_cpp.llama_memory_seq_rm(m._mem, 0, n, -1)
        del m.tokens[n:]
        after = m.decode([42], outputs="last").copy()
        reference = fresh.decode([*prompt, 42], outputs="last").copy()
        assert np.abs(after - reference).max() > 1e-2


def test_a_second_rollback_before_a_decode_is_refused(hybrid_models) -> None:
    with Model(hybrid_models.target, OPTS) as m:
        m.decode([1, *range(300, 310)], outputs="all")
        m.truncate(9)
        assert not m.can_truncate(8)  # llama.cpp's pending rollback is single-use
        with pytest.raises(RollbackError):
            m.truncate(8)


def test_checkpoint_rollback_across_single_token_decodes(hybrid_models) -> None:
    """Draft models decode one token at a time: they go back through a saved state (saved by the
    drafter after its catch-up, and once per prompt by the model itself)."""
    with Model(hybrid_models.draft, OPTS) as m, Model(hybrid_models.draft, OPTS) as fresh:
        prompt = m.tokenize(PROMPT)
        m.decode(prompt, outputs="last")
        for t in (300, 301, 302, 303):
            m.decode([t], outputs="last")
        assert m._rollback_room == 0 and m.can_truncate(len(prompt) + 1)
        m.truncate(len(prompt) + 1)  # the automatic checkpoint at the prompt's end, then replay 300
        m.decode([301, 302, 303, 304], outputs="last")
        m.checkpoint()
        for t in (305, 306, 307):
            m.decode([t], outputs="last")
        m.truncate(len(prompt) + 6)  # keep 305: restore the checkpoint, replay 305
        after = m.decode([42], outputs="last").copy()
        kept = [*prompt, 300, 301, 302, 303, 304, 305, 42]
        assert m.tokens == kept
        reference = fresh.decode(kept, outputs="last").copy()
        np.testing.assert_allclose(after, reference, rtol=1e-4, atol=1e-4)
        assert llama_cpp.llama_memory_seq_pos_max(m._mem, 0) + 1 == m.n_past
        assert not m.can_truncate(len(prompt) + 2)
        with pytest.raises(RollbackError, match="not 5"):  # before the checkpoint, beyond the snapshots
            m.truncate(len(prompt) + 2)
        assert m.tokens == kept  # refused: nothing changed


@pytest.mark.parametrize("draft_max", [1, 3, 8, "auto"])
@pytest.mark.parametrize(
    "pair", ["hybrid+llama", "hybrid+hybrid", "llama+hybrid", "hybrid+ngram", "qwen35+llama", "qwen35+hybrid"]
)
def test_greedy_speculative_equals_plain_greedy(hybrid_models, fixture_models, pair, draft_max) -> None:
    targets = {"llama": fixture_models.target, "hybrid": hybrid_models.target, "qwen35": hybrid_models.qwen35}
    target = targets[pair.split("+")[0]]
    drafts = {"llama": fixture_models.draft, "hybrid": hybrid_models.draft, "ngram": "ngram"}
    draft = drafts[pair.split("+")[1]]
    # The synthetic Qwen3.5 turns NaN from position 33 on (see specli_synth.hybrid): short generations.
    n = 24 if pair.startswith("qwen35") else 60
    expected = plain_greedy(target, PROMPT, n)
    with load(target, draft, n_ctx=512, n_threads=1) as spec:
        params = GenerationParams(max_tokens=n, sampling=GREEDY, draft_max=draft_max)
        generation = spec.generate(PROMPT, params)
        got = tokens_of(generation)
        assert got == expected
        assert spec.target.tokens == generation.context[:-1]
        if draft_max != "auto" and pair != "hybrid+ngram":
            stats = generation.stats
            assert stats.drafted > 0 and 0 < stats.accepted < stats.drafted
        # A second prompt that shares only a prefix: the caches go back (or start over) correctly.
        other = "The old man"
        again = tokens_of(spec.generate(other, replace(params, max_tokens=n // 2)))
        assert again == plain_greedy(target, other, n // 2)


def test_draft_length_is_capped_by_the_rollback_bound(hybrid_models, fixture_models) -> None:
    expected = plain_greedy(hybrid_models.target, PROMPT, 50)
    target = Model(hybrid_models.target, ModelOptions(n_ctx=512, n_threads=1, max_rollback=2))
    drafter = DraftModelDrafter(Model(fixture_models.draft, OPTS), target.n_vocab, DRAFT_MODEL.name)
    engine = SpeculativeEngine(target, drafter)
    engine.costs = free_drafting()  # so that auto drafts as much as it may
    try:
        assert target.max_rollback == 2
        for k in (8, "auto"):
            params = GenerationParams(max_tokens=50, sampling=GREEDY, draft_max=k)
            events = list(engine.generate(target.tokenize(PROMPT), params))
            assert tokens_of(events) == expected
            ks = [e.k for e in events if isinstance(e, RoundEvent)]
            assert max(ks) == 2
    finally:
        drafter.close()
        target.close()


def test_bench_and_run_label_the_k_a_hybrid_target_runs(hybrid_models, fixture_models, tmp_path) -> None:
    """On a hybrid target -k 32 is capped at the rollback bound (16): bench labelled the row k = 32
    and predicted for 32. The row is k = 16 (one row for 16 and 32), its runs draft at most 16, a note
    says why; `run -k 32` says so too."""
    import json
    import subprocess

    from support import EXE, _env

    out = tmp_path / "b.json"
    proc = subprocess.run([EXE, "bench", "--target", str(hybrid_models.target), "--draft", "ngram",
                           "-k", "4,16,32", "--temp", "0", "-n", "24", "--repeat", "1", "-t", "1",
                           "--json", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["options"]["ks"] == [4, 16] and data["options"]["ks_capped"] == {"32": 16}
    assert [c["k"] for c in data["configs"]] == [4, 16]
    assert all(max(r["k_per_round"], default=0) <= r["k"] for r in data["runs"] if r["mode"] == "spec")
    assert max(p["m"] for p in data["verify_curve"]["points"]) == 17  # the verify curve up to what is used
    assert "-k 32 ran as k = 16" in " ".join(proc.stdout.split())
    run = subprocess.run([EXE, "run", "--target", str(hybrid_models.target), "--draft", "ngram", "-k", "32",
                          PROMPT, "-n", "4", "-t", "1", "--json"], capture_output=True, text=True,
                         cwd=tmp_path, env=_env(tmp_path), timeout=300)
    assert run.returncode == 0 and "rolls back at most 16 positions" in run.stderr, run.stderr


def test_target_without_rollback_is_refused_clearly(hybrid_models, fixture_models) -> None:
    """n_rs_seq = 0 is what llama.cpp gives an architecture without bounded rollback (mamba, rwkv,
    jamba, ...): the engine refuses to speculate, names the architecture and the way out."""
    target = Model(hybrid_models.target, ModelOptions(n_ctx=512, n_threads=1, max_rollback=0))
    try:
        assert target.is_recurrent and target.max_rollback == 0
        drafter = DraftModelDrafter(Model(fixture_models.draft, OPTS), target.n_vocab, DRAFT_MODEL.name)
        with pytest.raises(ValueError, match=r"\(lfm2\).*--no-draft"):
            SpeculativeEngine(target, drafter)
        drafter.close()
        plain = SpeculativeEngine(target, None)  # plain decoding still works
        params = GenerationParams(max_tokens=20, sampling=GREEDY)
        got = tokens_of(plain.generate(target.tokenize(PROMPT), params))
        assert got == plain_greedy(hybrid_models.target, PROMPT, 20)
    finally:
        target.close()


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def _null_threshold(p: np.ndarray, n: int) -> float:
    sims = np.random.default_rng(5).multinomial(n, p / p.sum(), size=400) / n
    return float(np.quantile(0.5 * np.abs(sims - p).sum(axis=1), 0.999))


@pytest.mark.parametrize("pair", ["hybrid+hybrid", "hybrid+llama"])
def test_sampled_tokens_follow_the_target_distribution(hybrid_models, fixture_models, pair) -> None:
    """Positions 1 and 2 of many seeded generations against the hybrid target's exact distributions."""
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    trials = 1200
    target = hybrid_models.target
    draft = hybrid_models.draft if pair == "hybrid+hybrid" else fixture_models.draft
    with Model(target, OPTS) as ref:
        prompt = ref.tokenize(PROMPT)
        p1 = process_logits(ref.decode(prompt, outputs="last")[0], params)
    firsts, seconds = Counter(), Counter()
    drafted = accepted = 0
    with load(target, draft, n_ctx=256, n_threads=1) as spec:
        for seed in range(trials):
            run = GenerationParams(max_tokens=4, sampling=params, seed=seed, draft_max=3)
            generation = spec.generate(prompt, run)
            got = tokens_of(generation)
            firsts[got[0]] += 1
            seconds[tuple(got[:2])] += 1
            drafted += generation.stats.drafted
            accepted += generation.stats.accepted
    assert drafted > 0 and 0 < accepted < drafted  # rollbacks happened
    freq1 = np.zeros_like(p1)
    for t, c in firsts.items():
        freq1[t] = c / trials
    assert _tv(freq1, p1) < _null_threshold(p1, trials)
    t1 = max(firsts, key=firsts.get)
    n_cond = firsts[t1]
    with Model(target, OPTS) as ref:
        p2 = process_logits(ref.decode([*prompt, t1], outputs="last")[0], params)
    freq2 = np.zeros_like(p2)
    for (a, b), c in seconds.items():
        if a == t1:
            freq2[b] += c / n_cond
    assert _tv(freq2, p2) < _null_threshold(p2, n_cond)


def test_interrupts_anywhere_leave_hybrid_caches_consistent(hybrid_models) -> None:
    greedy = GenerationParams(max_tokens=30, sampling=GREEDY, draft_max=3)
    expected = plain_greedy(hybrid_models.target, PROMPT, 30)
    rng = np.random.default_rng(0)
    interrupted = 0
    with load(hybrid_models.target, hybrid_models.draft, n_ctx=1024, n_threads=1) as spec:
        for point in sorted(rng.integers(50, 6000, size=24).tolist()):
            params = GenerationParams(max_tokens=60, sampling=SamplingParams(temperature=1.0), draft_max=4,
                                      ignore_eos=True, seed=point)
            sys.settrace(interrupt_on_line(point))
            try:
                for _ in spec.generate((PROMPT + " ") * 4, params):
                    pass
            except KeyboardInterrupt:
                interrupted += 1
            finally:
                sys.settrace(None)
            for model in (spec.target, spec.drafter.model):
                assert llama_cpp.llama_memory_seq_pos_max(model._mem, 0) + 1 == model.n_past
            assert tokens_of(spec.generate(PROMPT, greedy)) == expected
    assert interrupted > 12


def test_plain_decoding_allocates_no_snapshots(hybrid_models) -> None:
    with load(hybrid_models.target, None, n_ctx=256, n_threads=1) as spec:
        assert spec.target.rs_seq == 0
        got = tokens_of(spec.generate(PROMPT, GenerationParams(max_tokens=20, sampling=GREEDY)))
        assert got == plain_greedy(hybrid_models.target, PROMPT, 20)


def test_mtp_draft_is_refused_clearly(hybrid_models) -> None:
    with pytest.raises(ValueError, match=r"has no MTP .*lfm2\.nextn_predict_layers is 0.*--draft ngram"):
        load(hybrid_models.target, "mtp", n_ctx=256, n_threads=1)
