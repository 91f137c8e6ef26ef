"""A synthetic Qwen3.5 model with one MTP (multi-token prediction, "NextN") block.

llama.cpp runs a Qwen3.5 GGUF's MTP block as a separate context (``LLAMA_CONTEXT_TYPE_MTP``) over the
same model: at position p it reads the token x_p and the target's hidden state h_{p-1} (the one that
predicted x_p) and predicts x_{p+1}. The block is stored after the trunk's layers (``blk.{n_layer}``,
``{arch}.block_count`` = trunk + 1, ``{arch}.nextn_predict_layers`` = 1): a gated full-attention
decoder block with three extra tensors, ``nextn.eh_proj`` (2·d → d over [enorm(embed(x_p)),
hnorm(h_{p-1})]), ``nextn.enorm`` and ``nextn.hnorm``; it shares the trunk's embedding, final norm and
output head (``src/models/qwen35.cpp``, ``graph_mtp``).

The trunk is :func:`specli_synth.hybrid.write_ngram_qwen35`'s (bigram statistics, random blocks). The
MTP block is structured so that it predicts what the target will predict one step later: eh_proj
passes the token's embedding through (the target's logits are mostly the bigram of its last token)
and adds a little of h, its attention and feed-forward add small random terms (so its KV cache and
the hidden state it is handed both move its logits, which the rollback checks need).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from specli_synth.fixtures import FIXTURE_TARGET, fixture_vocab
from specli_synth.gguf_writer import WeightDType
from specli_synth.hybrid import Qwen35Spec, _write_gguf, add_qwen35_keys, ngram_qwen35_weights
from specli_synth.ngram_model import SynthModelConfig, random_matrix
from specli_synth.vocab import TrainedVocab


def mtp_tensor_shapes(spec: Qwen35Spec) -> dict[str, tuple[int, ...]]:
    """The MTP block's tensors (numpy shapes (out, in)), as blk.{spec.n_layer}.*."""
    d, i = spec.n_embd, spec.n_layer
    return spec.layer_shapes(i, recurrent=False) | {  # an attention block, then the MTP projection
        f"blk.{i}.nextn.eh_proj.weight": (d, 2 * d),
        f"blk.{i}.nextn.enorm.weight": (d,),
        f"blk.{i}.nextn.hnorm.weight": (d,),
    }


def mtp_weights(
    spec: Qwen35Spec, seed: int, *, h_gain: float = 0.2, block_gain: float = 0.2
) -> dict[str, Callable[[], np.ndarray]]:
    """The MTP block: eh_proj = [I | h_gain·random], attention and feed-forward outputs of rms
    *block_gain* (random), every norm weight 1."""
    d = spec.n_embd

    def eh_proj() -> np.ndarray:
        m = np.zeros((d, 2 * d), dtype=np.float32)
        m[:, :d] = np.eye(d, dtype=np.float32)
        m[:, d:] = random_matrix((d, d), h_gain / np.sqrt(d), seed, "nextn.eh_proj.h")()
        return m

    weights: dict[str, Callable[[], np.ndarray]] = {}
    for name, shape in mtp_tensor_shapes(spec).items():
        kind = name.split(".")[-2]
        if kind == "eh_proj":
            weights[name] = eh_proj
        elif len(shape) == 1:
            weights[name] = lambda n=shape[0]: np.ones(n, dtype=np.float32)
        else:
            gain = block_gain if kind in ("attn_output", "ffn_down") else 1.0
            weights[name] = random_matrix(shape, gain / np.sqrt(shape[1]), seed, name)
    return weights


def write_qwen35_mtp_gguf(
    path: str | Path,
    spec: Qwen35Spec,
    trained: TrainedVocab,
    config: SynthModelConfig,
    *,
    dtype: WeightDType = "f32",
    h_gain: float = 0.2,
    block_gain: float = 0.2,
    mixer_gain: float = 0.3,
) -> Path:
    """Write a ``qwen35`` GGUF of *spec*'s trunk (bigram weights of *config*) plus one MTP block
    (:func:`mtp_weights` with *h_gain* and *block_gain*)."""
    arch = "qwen35"

    def keys(writer: Any, arch: str) -> None:
        add_qwen35_keys(writer, arch, spec, mtp_layers=1)  # the MTP block counts as a block

    shapes = spec.tensor_shapes() | mtp_tensor_shapes(spec)
    weights = dict(ngram_qwen35_weights(spec, trained, config, mixer_gain=mixer_gain)) | mtp_weights(
        spec, config.seed, h_gain=h_gain, block_gain=block_gain)
    return _write_gguf(path, arch, spec.name, spec.n_vocab, spec.n_embd, spec.n_ctx_train, keys,
                       trained.vocab, shapes, weights, dtype, f32_marker=".ssm_conv1d.")


def build_mtp_fixture(
    directory: str | Path,
    *,
    seed: int = 0,
    dtype: WeightDType = "f32",
    name: str = "fixture-qwen35-mtp.gguf",
    **gains: float,
) -> Path:
    """A tiny Qwen3.5 with an MTP block, the fixture vocabulary and FIXTURE_TARGET's widths (3
    delta-net layers, one attention layer, the MTP block); deterministic for a seed. *gains*:
    h_gain, block_gain, mixer_gain of :func:`write_qwen35_mtp_gguf`. With the defaults the MTP head's
    greedy drafts are accepted ~0.6 of the time at k = 1."""
    config = replace(FIXTURE_TARGET, seed=FIXTURE_TARGET.seed + 1000 * seed)
    trained = fixture_vocab()
    spec = Qwen35Spec(
        n_vocab=len(trained.vocab),
        n_embd=config.n_embd,
        n_layer=4,
        n_ff=config.n_ff,
        n_head=config.n_head,
        n_head_kv=config.n_head_kv,
        head_dim=config.n_embd // config.n_head,
        ssm_k_heads=config.n_head_kv,
        ssm_v_heads=config.n_head,
        name=config.name.replace("fixture", "fixture-qwen35-mtp"),
    )
    return write_qwen35_mtp_gguf(Path(directory) / name, spec, trained, config, dtype=dtype, **gains)
