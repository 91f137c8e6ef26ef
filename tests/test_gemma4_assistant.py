"""Gemma 4's assistant (a `gemma4-assistant` GGUF, llama.cpp's draft-mtp in its shared-memory mode).

The files are synth's (specli_synth.gemma4): a Gemma 4 target and an assistant in the layouts llama.cpp
loads, the assistant structured (it predicts what the target will predict, from the target's hidden
state and its KV cache) or random. What is checked: the file is recognised and run by itself; same-as-
plain prints --no-draft's tokens (F32 and Q4_K_M targets, greedy and T 0.8); the rejection rule follows
the target; after a generation with rejections the assistant's next draft is a fresh run's, bit for
bit, and a wrong hidden state or one wrong cache row changes it (the check can fail); an assistant for
another target is refused with what differs; llama.cpp's own tool accepts as often on the same files,
and the exported llama-server command drafts with them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from support import assert_one_line_error, specli
from test_bench_server import needs_llama_server, runner
from test_trained_drafters import (
    DEFAULT_FILTERS,
    N_CTX,
    PROMPT,
    check_rows_filtered_in_the_graph,
    check_the_exported_llama_server,
    check_the_rejection_rule,
    context_after_rejections,
    fresh_next_draft,
    generate,
    llama_speculative_simple,
    next_draft,
    quantized_q4_k_m,
)

from specli import SamplingParams, load
from specli.cli import app
from specli.drafters.registry import DRAFTERS, drafter_kind
from specli.gguf_info import read_gguf_info
from specli_synth.gemma4 import (
    GEMMA4_SIZES,
    Gemma4Files,
    Gemma4Sizes,
    write_gemma4_assistant,
    write_gemma4_set,
)

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory) -> Gemma4Files:
    return write_gemma4_set(tmp_path_factory.mktemp("gemma4"))


@pytest.fixture(scope="module")
def gemma4_q8(tmp_path_factory) -> Gemma4Files:
    """Q8_0: llama.cpp computes a row bit for bit alike in any batch (an F32 one may differ by ~1e-6)."""
    return write_gemma4_set(tmp_path_factory.mktemp("gemma4-q8"), dtype="q8_0")


@pytest.fixture(scope="module")
def gemma4_kquant(tmp_path_factory) -> Gemma4Files:
    """A 256-wide set (rows K-quants take), the target quantized to Q4_K_M by llama.cpp."""
    directory = tmp_path_factory.mktemp("gemma4-kquant")
    files = write_gemma4_set(directory, sizes=Gemma4Sizes(n_embd=256, n_ff=512, assistant_embd=128))
    return replace(files, target=quantized_q4_k_m(files.target, directory / "gemma4-target-q4_k_m.gguf"))


def assistant(files: Gemma4Files, random: bool = False) -> Path:
    return files.assistant_random if random else files.assistant


def test_the_assistant_file_is_recognised_and_drafts_by_itself(gemma4) -> None:
    info = read_gguf_info(gemma4.assistant)
    assert info.architecture == "gemma4-assistant"
    assert {"nextn.pre_projection.weight", "nextn.post_projection.weight"} <= {t.name for t in info.tensors}
    assert info.metadata["gemma4-assistant.embedding_length_out"] == \
        read_gguf_info(gemma4.target).metadata["gemma4.embedding_length"]
    assert drafter_kind(gemma4.assistant) is DRAFTERS["assistant"]
    _, stats = generate(gemma4.target, gemma4.assistant, 64, GREEDY)
    assert stats["accepted_by_drafter"].keys() == {"assistant"} and stats["acceptance_rate"] > 0.4


def test_python_m_specli_synth_writes_the_set(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "specli_synth", "gemma4", str(tmp_path / "set")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    written = sorted(p.name for p in (tmp_path / "set").iterdir())
    assert written == ["gemma4-assistant-random.gguf", "gemma4-assistant.gguf", "gemma4-target.gguf"]


# -- exact --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "T0.8"])
@pytest.mark.parametrize("random", [False, True], ids=["structured", "random"])
def test_same_as_plain_prints_no_drafts_tokens(gemma4, random: bool, temperature: float) -> None:
    sampling = SamplingParams(temperature=temperature)
    plain, _ = generate(gemma4.target, None, 256, sampling)
    drafted, stats = generate(gemma4.target, assistant(gemma4, random), 256, sampling)
    assert drafted == plain
    assert stats["drafted"] > 100 and (stats["accepted"] > 50 or random)


def test_same_as_plain_on_a_k_quant_target(gemma4_kquant) -> None:
    """Q4_K_M: llama.cpp computes a batch with other kernels than one token; with batch-invariant
    arithmetic (the default) the verify rows are plain decoding's, seeded and greedy alike."""
    for temperature in (0.0, 0.8):
        sampling = SamplingParams(temperature=temperature)
        plain, _ = generate(gemma4_kquant.target, None, 256, sampling)
        drafted, stats = generate(gemma4_kquant.target, gemma4_kquant.assistant, 256, sampling)
        assert drafted == plain, temperature
        assert stats["accepted"] > 30


def test_a_seeded_rejection_rule_run_repeats_itself(gemma4) -> None:
    sampling = SamplingParams(temperature=0.8)
    first = generate(gemma4.target, gemma4.assistant, 128, sampling, seed=3, same_as_plain=False)
    again = generate(gemma4.target, gemma4.assistant, 128, sampling, seed=3, same_as_plain=False)
    assert first[0] == again[0] and first[1]["accepted"] > 10


def test_the_rejection_rule_follows_the_target_with_the_assistant(gemma4) -> None:
    """k = 1, the rejection rule: position 1 is the assistant's draw from its own q, accepted with
    min(1, p/q), else drawn from the residual; when it is accepted the bonus comes from p after it.
    Each plausible wrong rule (resample from p or q, an unnormalised residual, the bonus from the
    wrong row) would be caught."""
    check_the_rejection_rule(gemma4.target, gemma4.assistant, FIRST_PROMPT, "assistant")


FIRST_PROMPT = "The sun"  # position 1: acceptance 0.41, every wrong rule >= 3 null thresholds away


@pytest.mark.parametrize("sampling", [DEFAULT_FILTERS, GREEDY], ids=["defaults", "greedy"])
def test_its_rows_are_filtered_in_the_graph_where_the_runs_are(gemma4, sampling) -> None:
    check_rows_filtered_in_the_graph(gemma4.target, gemma4.assistant, lambda d: d.assistant, sampling)


# -- what it reads after rejections --------------------------------------------------------------------


@pytest.mark.parametrize("random", [False, True], ids=["structured", "random"])
def test_after_rejections_a_draft_is_a_fresh_runs(gemma4_q8, random: bool, monkeypatch) -> None:
    """The assistant keeps nothing of its own: it reads the target's KV cache and hidden state. After
    100 greedy tokens with k = 4 (drafts accepted in part and rejected after) its next draft equals,
    bit for bit, the draft of one that loads the committed context afresh (Q8_0: no batch shape
    changes a row); with the hidden state of the position before, or one cache row of another token,
    it does not (the check can fail)."""
    head = assistant(gemma4_q8, random)
    with load(gemma4_q8.target, head, n_ctx=N_CTX, n_threads=1) as spec:
        context = context_after_rejections(spec, random)
        kept = next_draft(spec, context)
        target = spec.target
        with monkeypatch.context() as patch:
            rows = target.hidden_rows
            patch.setattr(target, "hidden_rows", lambda start, stop: rows(start - 1, stop - 1))
            wrong_h = next_draft(spec, context)
        n = len(context)
        target.truncate(n - 3)
        target.decode([context[n - 2], context[n - 2]], outputs="none")  # position n - 3 holds another token
        wrong_row = next_draft(spec, context)
    expected = fresh_next_draft(gemma4_q8.target, head, context)
    assert len(kept) == len(expected) == 4
    assert all(np.array_equal(a, b) for a, b in zip(kept, expected, strict=True))
    for spoilt in (wrong_h, wrong_row):
        assert not all(np.array_equal(a, b) for a, b in zip(spoilt, expected, strict=True))


def test_its_warm_up_at_load_leaves_no_trace(gemma4_q8, monkeypatch) -> None:
    """At load the assistant runs one step (a process's first costs ~1.5x a later one; -k auto then
    times its first look as a warm one): the target's cache is still empty, and the first draft equals,
    bit for bit, that of a load without the warm-up."""
    head = assistant(gemma4_q8)

    def first_draft(spec) -> list[np.ndarray]:
        context = spec.tokenize(PROMPT)
        spec.target.decode(context[:-1], outputs="none")
        return next_draft(spec, context)

    with load(gemma4_q8.target, head, n_ctx=N_CTX, n_threads=1) as spec:
        assert spec.engine.costs.warmed_up(spec.drafter.sources[0].name) and spec.target.n_past == 0
        warmed = first_draft(spec)
    monkeypatch.setattr(type(spec.drafter), "warm_up", lambda self: ())
    with load(gemma4_q8.target, head, n_ctx=N_CTX, n_threads=1) as cold:
        assert not cold.engine.costs.warmed_up(cold.drafter.sources[0].name)
        expected = first_draft(cold)
    assert len(warmed) == len(expected) == 4
    assert all(np.array_equal(a, b) for a, b in zip(warmed, expected, strict=True))


# -- refusals -----------------------------------------------------------------------------------------


def test_an_assistant_for_another_target_is_refused_with_what_differs(gemma4, gemma4_kquant, trained_drafters,
                                                                      tmp_path: Path) -> None:
    proc = specli("run", "--target", str(trained_drafters.target), "--draft", str(gemma4.assistant),
                  "-n", "4", "hi", cwd=tmp_path)
    assert_one_line_error(proc, 1, "gemma4-assistant.gguf cannot draft for target.gguf",
                          "is a Gemma 4 assistant", "target.gguf is a qwen3 model")
    proc = specli("run", "--target", str(gemma4_kquant.target), "--draft", str(gemma4.assistant),
                  "-n", "4", "hi", cwd=tmp_path)
    assert_one_line_error(proc, 1, "trained for a target of hidden size 128",
                          "gemma4-target-q4_k_m.gguf's is 256")
    # Layers that would view the target's caches with another shape (llama.cpp aborts the process on the
    # first draft: a view past its source's end).
    for sizes, fragments in (
        (replace(GEMMA4_SIZES, n_head_kv=4), ("sliding-window layers read [4] KV heads",
                                              "gemma4-target.gguf's layer 2 has 2")),
        (replace(GEMMA4_SIZES, head_dim=64), ("full layers have heads of 64",
                                              "gemma4-target.gguf's layer 3, whose cache they read, has 32")),
    ):
        other = write_gemma4_assistant(tmp_path / "other-assistant.gguf", sizes=sizes)
        proc = specli("run", "--target", str(gemma4.target), "--draft", str(other), "-n", "4", "hi",
                      cwd=tmp_path)
        assert_one_line_error(proc, 1, "other-assistant.gguf cannot draft for gemma4-target.gguf", *fragments)


def test_a_drafter_given_as_the_target_and_mtp_on_gemma4_say_what_to_do(gemma4, trained_drafters,
                                                                        tmp_path: Path) -> None:
    for drafter, what in ((gemma4.assistant, "a Gemma 4 assistant"),
                          (trained_drafters.eagle3, "an EAGLE-3 head"),
                          (trained_drafters.dflash, "a DFlash drafter")):
        proc = specli("run", "--target", str(drafter), "-n", "4", "hi", cwd=tmp_path)
        assert_one_line_error(proc, 1, f"{drafter.name} is a trained drafter ({what})",
                              "give it as --draft beside the model it was trained for")
    proc = specli("run", "--target", str(gemma4.target), "--draft", "mtp", "-n", "4", "hi", cwd=tmp_path)
    assert_one_line_error(proc, 1, "has no MTP", "use its Gemma 4 assistant file (--draft ASSISTANT.gguf)")


# -- llama.cpp runs the same files --------------------------------------------------------------------


def test_llama_speculative_simple_accepts_as_specli_does(gemma4) -> None:
    """llama.cpp's own tool runs the pair with --spec-type draft-mtp; greedy, k = 4, the acceptance
    rates agree within 2 points."""
    drafted, accepted = llama_speculative_simple(gemma4.target, gemma4.assistant, "assistant", 200, 4)
    _, stats = generate(gemma4.target, gemma4.assistant, 200, GREEDY)
    ours = stats["accepted"] / stats["drafted"]
    assert drafted > 100 and abs(ours - accepted / drafted) <= 0.02, (ours, accepted / drafted)


def test_export_names_each_engine_s_equivalent(gemma4) -> None:
    def export(engine: str) -> dict:
        result = runner.invoke(app, ["export", "--to", engine, "--json", "-m", str(gemma4.target),
                                     "--draft", str(gemma4.assistant), "-k", "3"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    argv = export("llama-server")["argv"]
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert argv[argv.index("-md") + 1] == str(gemma4.assistant)
    vllm = export("vllm")["argv"]
    config = json.loads(vllm[vllm.index("--speculative-config") + 1])
    assert config == {"method": "mtp", "model": "HF_DRAFT_REPO", "num_speculative_tokens": 3}
    sglang = export("sglang")
    assert "--speculative-algorithm" not in sglang["argv"]
    assert any("(assistant): the command serves without speculative decoding" in n for n in sglang["notes"])


@needs_llama_server
def test_the_exported_llama_server_command_drafts_with_the_assistant(gemma4, tmp_path: Path) -> None:
    check_the_exported_llama_server(gemma4.target, gemma4.assistant, "draft-mtp", tmp_path)


def test_bench_runs_the_assistant(gemma4, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "-m", str(gemma4.target), "--draft", str(gemma4.assistant),
                                 "-k", "2", "--temp", "0", "-n", "24", "--repeat", "1", "-c", "512",
                                 "-t", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "gemma4-assistant.gguf (a trained drafter that reads the target's" in text, text
    assert "draft: assistant " in text and "ms/token" in text
    [config] = json.loads(out.read_text())["configs"]
    assert config["acceptance_rate"] > 0.3
