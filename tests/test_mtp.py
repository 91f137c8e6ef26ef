"""`--draft mtp`: self-drafting from the target's own MTP (NextN) block, on real llama.cpp inference
over a tiny Qwen3.5 with one MTP block written by specli_synth.mtp. Greedy and seeded output equal
plain decoding, the MTP context's rollback, and the refusal on a model without MTP layers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from sampling_reference import process_logits
from support import interrupt_on_line, null_tv_threshold, plain_greedy, tv

from specli import GenerationParams, SamplingParams, load
from specli.heads import MTPContext
from specli.llama import LlamaError, Model, ModelOptions
from specli_synth.mtp import build_mtp_fixture

PROMPTS = ("Once upon a time", "The function returns")
GREEDY = SamplingParams(temperature=0.0)
N = 48  # past position 33, where the Qwen3.5 fixture's logits once turned NaN
EXE = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))


@pytest.fixture(scope="session")
def mtp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mtp_fixture(tmp_path_factory.mktemp("mtp-model"))


def run(spec, prompt: str, **params) -> tuple[list[int], dict]:
    generation = spec.generate(prompt, GenerationParams(ignore_eos=True, **params)).complete()
    return generation.tokens, generation.stats.as_dict()


def test_fixture_has_an_mtp_block_and_stays_finite(mtp_model) -> None:
    with Model(mtp_model, ModelOptions(n_ctx=512, n_threads=1, load_mtp=True)) as m:
        assert m.architecture == "qwen35" and m.is_recurrent and m.n_layer_nextn == 1
        rows = m.decode(m.tokenize(PROMPTS[0]), outputs="last")
        for _ in range(200):
            rows = m.decode([int(np.argmax(rows[0]))], outputs="last")
        assert np.isfinite(rows).all() and np.isfinite(m.hidden_rows(0, m.n_past)).all()


@pytest.mark.parametrize("k", [1, 3, "auto"])
def test_greedy_mtp_drafting_equals_plain_greedy(mtp_model, k) -> None:
    with load(mtp_model, "mtp", n_ctx=512, n_threads=1) as spec:
        drafted = accepted = 0
        for prompt in PROMPTS:
            reference = plain_greedy(mtp_model, prompt, N, stop_at_eog=False)
            tokens, stats = run(spec, prompt, max_tokens=N, sampling=GREEDY, draft_max=k, seed=1)
            assert tokens == reference, prompt
            drafted, accepted = drafted + stats["drafted"], accepted + stats["accepted"]
        if k != "auto":  # auto may find drafting does not pay on this tiny model
            assert drafted >= len(PROMPTS) * N // (k + 1) and 0 < accepted < drafted


def test_generations_in_a_row_reuse_the_mtp_cache(mtp_model) -> None:
    """A second generation (same prompt, then a longer one sharing it) keeps what the MTP context
    holds of the common prefix and still equals plain decoding."""
    reference = plain_greedy(mtp_model, PROMPTS[0], 24, stop_at_eog=False)
    with load(mtp_model, "mtp", n_ctx=512, n_threads=1) as spec:
        for _ in range(2):
            tokens, _ = run(spec, PROMPTS[0], max_tokens=24, sampling=GREEDY, draft_max=3, seed=1)
            assert tokens == reference
        longer = spec.tokenize(PROMPTS[0]) + reference[:10]
        tokens = spec.generate(longer, GenerationParams(max_tokens=14, sampling=GREEDY, draft_max=3,
                                                        ignore_eos=True)).complete().tokens
        assert tokens == reference[10:24]


@pytest.mark.parametrize("k", [3, "auto"])
def test_seeded_sampled_mtp_run_prints_plain_decodings_tokens(mtp_model, k) -> None:
    sampling = SamplingParams(temperature=0.9)
    with load(mtp_model, None, n_ctx=512, n_threads=1) as plain, \
            load(mtp_model, "mtp", n_ctx=512, n_threads=1) as spec:
        drafted = 0
        for seed in (3, 11):
            reference, _ = run(plain, PROMPTS[0], max_tokens=N, sampling=sampling, seed=seed)
            tokens, stats = run(spec, PROMPTS[0], max_tokens=N, sampling=sampling, seed=seed,
                                draft_max=k, same_as_plain=True)
            assert tokens == reference, seed
            drafted += stats["drafted"]
        if k != "auto":
            assert drafted > 0


def test_mtp_rollback_gives_the_logits_of_a_fresh_evaluation(mtp_model) -> None:
    """Drafted positions are dropped from the MTP context; what it computes next equals what a fresh
    MTP context computes over the same positions."""
    with Model(mtp_model, ModelOptions(n_ctx=512, n_threads=1, load_mtp=True)) as target:
        prompt = target.tokenize(PROMPTS[0])
        target.decode([*prompt, 300, 301, 302, 303], outputs="none")
        hidden = np.vstack([np.zeros((1, target.n_embd), np.float32), target.hidden_rows(0, target.n_past)])
        tokens = target.tokens
        n = len(prompt)
        mtp, fresh, kept = MTPContext(target), MTPContext(target), MTPContext(target)
        try:
            mtp.decode(tokens[:n], hidden[:n])
            _, h = mtp.decode([77], hidden[n : n + 1])  # a draft reads the MTP head's own h ...
            mtp.decode([78], h[None, :])
            mtp.truncate(n)  # ... and is dropped
            after, h_after = mtp.decode(tokens[n:], hidden[n : len(tokens)])
            reference, h_reference = fresh.decode(tokens, hidden[: len(tokens)])
            assert mtp.tokens == fresh.tokens == tokens
            assert np.abs(after - reference).max() < 1e-4
            assert np.abs(h_after - h_reference).max() < 1e-4
            # Had the draft stayed in the cache, the logits would differ: the check can fail.
            kept.decode([*tokens[:n], 77, 78], np.vstack([hidden[: n + 1], h[None, :]]))
            stale, _ = kept.decode(tokens[n:], hidden[n : len(tokens)])
            assert np.abs(stale - reference).max() > 1e-2
        finally:
            for context in (mtp, fresh, kept):
                context.close()


def test_what_the_mtp_drafter_times_at_load_leaves_no_trace(mtp_model, monkeypatch) -> None:
    """At load the MTP drafter runs a draft step's shape once (its first look is then timed warm) and
    times a catch-up of 16 positions (what each position plain rounds commit costs its next look,
    which -k auto weighs before it watches a declined head): the figures are there, the MTP context is
    empty, and the first draft's distributions are, bit for bit, those of a load that did neither."""
    from test_trained_drafters import next_draft

    def first_draft(spec) -> list[np.ndarray]:
        context = spec.tokenize(PROMPTS[0])
        spec.target.decode(context[:-1], outputs="none")
        return next_draft(spec, context)

    with load(mtp_model, "mtp", n_ctx=512, n_threads=1) as spec:
        costs, source = spec.engine.costs, spec.drafter.sources[0].name
        assert costs.warmed_up(source) and costs.catch_up_seconds_per_position(source) is not None
        assert spec.drafter.mtp.n_past == 0 and spec.drafter.mtp.tokens == []
        timed = first_draft(spec)
    monkeypatch.setattr(type(spec.drafter), "warm_up", lambda self: ())
    monkeypatch.setattr(type(spec.drafter), "catch_up_costs", lambda self: {})
    with load(mtp_model, "mtp", n_ctx=512, n_threads=1) as untimed:
        costs, source = untimed.engine.costs, untimed.drafter.sources[0].name
        assert not costs.warmed_up(source) and costs.catch_up_seconds_per_position(source) is None
        expected = first_draft(untimed)
    assert len(timed) == len(expected) == 4
    assert all(np.array_equal(a, b) for a, b in zip(timed, expected, strict=True))


def test_mtp_context_needs_a_target_loaded_with_its_mtp_layers(mtp_model) -> None:
    with Model(mtp_model, ModelOptions(n_ctx=256, n_threads=1)) as target:
        with pytest.raises(LlamaError, match="load_mtp"):
            MTPContext(target)


def test_mtp_draft_is_refused_on_a_model_without_mtp_layers(fixture_models) -> None:
    with pytest.raises(ValueError, match=r"has no MTP .*llama\.nextn_predict_layers is 0.*--draft ngram"):
        load(fixture_models.target, "mtp", n_ctx=256, n_threads=1)


def _specli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CONFIG_HOME": str(cwd / "xdg"), "XDG_STATE_HOME": str(cwd / "state")}
    env.pop("SPECLI_CONFIG", None)
    return subprocess.run([EXE, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_cli_runs_draft_mtp_and_refuses_it_without_mtp_layers(mtp_model, fixture_models, tmp_path) -> None:
    common = ("-n", "24", "--temp", "0", "-k", "3", "-t", "1", "-c", "512", "--ignore-eos", "--json")
    spec = _specli("run", "-m", str(mtp_model), "--draft", "mtp", PROMPTS[0], *common, cwd=tmp_path)
    plain = _specli("run", "-m", str(mtp_model), "--no-draft", PROMPTS[0], *common, cwd=tmp_path)
    assert spec.returncode == 0 and plain.returncode == 0, (spec.stderr, plain.stderr)
    spec_out, plain_out = json.loads(spec.stdout), json.loads(plain.stdout)
    assert spec_out["tokens"] == plain_out["tokens"] and spec_out["stats"]["drafted"] > 0

    refused = _specli("run", "-m", str(fixture_models.target), "--draft", "mtp", PROMPTS[0], "-n", "4",
                      "-t", "1", cwd=tmp_path)
    assert refused.returncode == 1, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specli: error:") and "no MTP" in lines[0]
    assert "Traceback" not in refused.stderr


def test_interrupt_before_the_hidden_states_are_recorded(mtp_model, monkeypatch) -> None:
    """Ctrl-C can land after llama_decode and before the target records the hidden states the MTP
    head reads: the target then gives those positions up, and the next generation equals plain."""
    reference = plain_greedy(mtp_model, PROMPTS[0], 24, stop_at_eog=False)
    with load(mtp_model, "mtp", n_ctx=512, n_threads=1) as spec:
        record = Model._record_hidden
        calls = 0

        def interrupted(self, pos0: int, m: int) -> None:
            nonlocal calls
            calls += 1
            if calls == 4:  # a verify batch, a few rounds in
                raise KeyboardInterrupt
            record(self, pos0, m)

        monkeypatch.setattr(Model, "_record_hidden", interrupted)
        generation = spec.generate(PROMPTS[0], GenerationParams(max_tokens=24, sampling=GREEDY, draft_max=3,
                                                                ignore_eos=True))
        with pytest.raises(KeyboardInterrupt):
            generation.complete()
        generation.interrupt()
        target = spec.target
        assert target.n_past <= target._hidden_upto  # every cached position has its hidden state
        tokens, stats = run(spec, PROMPTS[0], max_tokens=24, sampling=GREEDY, draft_max=3)
        assert tokens == reference and stats["accepted"] > 0


def test_models_toml_cannot_shadow_mtp(mtp_model, tmp_path) -> None:
    from specli.config import ConfigError, load_config

    config = tmp_path / "models.toml"
    config.write_text(f'[models.mtp]\npath = "{mtp_model}"\n')
    with pytest.raises(ConfigError, match="'mtp' is reserved .*--draft mtp"):
        load_config(config)


def _sampled_run_interrupted(spec, seed: int, trace) -> bool:  # noqa: ANN001
    """A sampled MTP run (T 1, k = 4, 60 tokens) under `trace` (interrupt_on_line): whether Ctrl-C came."""
    params = GenerationParams(max_tokens=60, sampling=SamplingParams(temperature=1.0), draft_max=4,
                              ignore_eos=True, seed=seed)
    sys.settrace(trace)
    try:
        for _ in spec.generate((PROMPTS[0] + " ") * 4, params):
            pass
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


def test_interrupts_anywhere_leave_target_and_mtp_caches_consistent(mtp_model) -> None:
    """Ctrl-C between any two lines of specli's code (a line count, not a time): both caches still
    say what they hold, every cached target position has its hidden state, and the next greedy
    generation equals plain decoding."""

    greedy = GenerationParams(max_tokens=24, sampling=GREEDY, draft_max=3, ignore_eos=True)
    expected = plain_greedy(mtp_model, PROMPTS[0], 24, stop_at_eog=False)
    interrupted = 0
    with load(mtp_model, "mtp", n_ctx=1024, n_threads=1) as spec:
        for point in sorted(np.random.default_rng(0).integers(50, 6000, size=32).tolist()):
            interrupted += _sampled_run_interrupted(spec, point, interrupt_on_line(point))
            target, mtp = spec.target, spec.drafter.mtp
            assert llama_cpp.llama_memory_seq_pos_max(target._mem, 0) + 1 == target.n_past
            assert llama_cpp.llama_memory_seq_pos_max(mtp._mem, 0) + 1 == mtp.n_past
            assert target.n_past <= target._hidden_upto
            assert spec.generate(PROMPTS[0], greedy).complete().tokens == expected
    assert interrupted > 16


def test_an_interrupt_right_after_a_head_decode_leaves_its_cache_counted(mtp_model) -> None:
    """Ctrl-C on each line a head context runs after llama.cpp's decode returned (before the decode is
    counted, while it is, after): the cache and n_past still agree, and the next greedy generation
    equals plain decoding. The sweep above lands there only by chance."""

    greedy = GenerationParams(max_tokens=24, sampling=GREEDY, draft_max=3, ignore_eos=True)
    expected = plain_greedy(mtp_model, PROMPTS[0], 24, stop_at_eog=False)
    with load(mtp_model, "mtp", n_ctx=1024, n_threads=1) as spec:
        for nth in range(1, 5):
            params = GenerationParams(max_tokens=60, sampling=GREEDY, draft_max=4, ignore_eos=True)
            sys.settrace(interrupt_on_line(nth, in_function="_process", counts=lambda f: "rc" in f.f_locals))
            try:
                with pytest.raises(KeyboardInterrupt):
                    for _ in spec.generate((PROMPTS[0] + " ") * 4, params):
                        pass
            finally:
                sys.settrace(None)
            mtp = spec.drafter.mtp
            assert llama_cpp.llama_memory_seq_pos_max(mtp._mem, 0) + 1 == mtp.n_past == len(mtp.tokens)
            assert spec.generate(PROMPTS[0], greedy).complete().tokens == expected


def test_an_interrupt_right_after_a_recurrent_rollback_leaves_the_target_counted(mtp_model) -> None:
    """Ctrl-C on each line the target's recurrent rollback runs once llama.cpp has dropped the
    positions (a rejected draft of a Qwen3.5 target): its token list, checkpoint and cache still agree,
    and the next greedy generation equals plain decoding. Before, the tokens were trimmed after the
    guarded call: an interruption there left 28 counted over a cache of 25."""

    greedy = GenerationParams(max_tokens=24, sampling=GREEDY, draft_max=3, ignore_eos=True)
    expected = plain_greedy(mtp_model, PROMPTS[0], 24, stop_at_eog=False)
    interrupted = 0
    with load(mtp_model, "mtp", n_ctx=1024, n_threads=1) as spec:
        for nth in range(1, 6):
            interrupted += _sampled_run_interrupted(spec, nth, interrupt_on_line(
                nth, in_function="_truncate_recurrent", counts=lambda f: "ok" in f.f_locals))
            target = spec.target
            assert llama_cpp.llama_memory_seq_pos_max(target._mem, 0) + 1 == target.n_past
            assert target._checkpoint is None or target._checkpoint[0] <= target.n_past
            assert spec.generate(PROMPTS[0], greedy).complete().tokens == expected
    assert interrupted >= 3


def _with_an_mtp_layer_declared(source: Path, path: Path) -> Path:
    """A copy of a GGUF whose metadata declares one more block, an MTP one (nextn_predict_layers 1)."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(path, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name == f"{arch}.block_count":
            value += 1
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, field.types[0])
    writer.add_uint32(f"{arch}.nextn_predict_layers", 1)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type,
                          raw_shape=[int(x) for x in reversed(tensor.shape)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_mtp_draft_is_refused_on_an_architecture_without_an_mtp_graph(fixture_models, tmp_path) -> None:
    """A llama GGUF that declares an MTP layer: llama.cpp has no MTP graph for llama, so no MTP context."""
    path = _with_an_mtp_layer_declared(fixture_models.target, tmp_path / "llama-nextn.gguf")
    with pytest.raises(ValueError, match=r"has MTP layers, but .* only for .*qwen35.*not llama"):
        load(path, "mtp", n_ctx=256, n_threads=1)


def test_rejection_rule_with_mtp_drafts_follows_the_target_distribution(mtp_model) -> None:
    """--no-same-as-plain: the classic rule over the MTP head's q. Positions 1 and 2 of many seeded
    generations (the second drafted from the head's own hidden state) against the target's exact
    distributions, unfiltered at T = 1."""
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    trials = 1200
    with Model(mtp_model, ModelOptions(n_ctx=256, n_threads=1)) as ref:
        prompt = ref.tokenize(PROMPTS[0])
        p1 = process_logits(ref.decode(prompt, outputs="last")[0], params)
    firsts: Counter[int] = Counter()
    pairs: Counter[tuple[int, int]] = Counter()
    drafted = accepted = 0
    with load(mtp_model, "mtp", n_ctx=256, n_threads=1) as spec:
        for seed in range(trials):
            generation = spec.generate(prompt, GenerationParams(max_tokens=3, sampling=params, seed=seed,
                                                                draft_max=3, same_as_plain=False)).complete()
            firsts[generation.tokens[0]] += 1
            pairs[tuple(generation.tokens[:2])] += 1
            drafted += generation.stats.drafted
            accepted += generation.stats.accepted
    assert drafted > 0 and 0 < accepted < drafted  # rejections and rollbacks happened
    freq1 = np.zeros_like(p1)
    for token, count in firsts.items():
        freq1[token] = count / trials
    assert tv(freq1, p1) < null_tv_threshold(p1, trials)
    t1 = max(firsts, key=firsts.get)
    with Model(mtp_model, ModelOptions(n_ctx=256, n_threads=1)) as ref:
        p2 = process_logits(ref.decode([*prompt, t1], outputs="last")[0], params)
    freq2 = np.zeros_like(p2)
    for (a, b), count in pairs.items():
        if a == t1:
            freq2[b] += count / firsts[t1]
    assert tv(freq2, p2) < null_tv_threshold(p2, firsts[t1])


@pytest.mark.parametrize("greedy", [False, True], ids=["defaults", "greedy"])
def test_mtp_rows_are_filtered_in_the_graph_where_the_runs_are(mtp_model, greedy) -> None:
    from test_trained_drafters import DEFAULT_FILTERS, check_rows_filtered_in_the_graph

    sampling = SamplingParams(temperature=0.0) if greedy else DEFAULT_FILTERS
    check_rows_filtered_in_the_graph(mtp_model, "mtp", lambda d: d.mtp, sampling, prompt=PROMPTS[0])
