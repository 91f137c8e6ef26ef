"""Synthetic hybrid (recurrent + attention) GGUF models: LFM2 (short convolutions + attention) and
Qwen3.5 (gated delta-net + gated attention).

No hybrid GGUF can be downloaded in the test environment, so the tests write tiny deterministic LFM2
models with the fixture vocabulary of :mod:`specli_synth.fixtures`. The weights carry the same token
statistics as the llama fixtures, so a llama fixture drafts for an LFM2 target (and the other way
round) with partial acceptance:

* embedding, final norm and output rows are those of :func:`specli_synth.ngram_model.ngram_llama_weights`
  (bigram + skip-bigram + unigram logits, minus a repetition penalty);
* layer 0 is a short convolution that copies the *previous* token's skip-bigram factors into the slot
  the output reads (what the llama fixture's RoPE previous-token head does). Its recurrent state (the
  last tokens' inputs) therefore decides the logits: a wrongly restored state after a rollback shows;
* layer 1 is attention with zero queries and keys (uniform attention, the repetition-penalty head);
* any further layers alternate convolution and attention with small random weights.

Every feed-forward block is random noise of small gain, as in the llama fixtures.

Qwen3.5 (:func:`write_ngram_qwen35`): gated delta-net layers and gated attention with random
weights over the same embedding and output rows (bigram logits); the delta-net state moves the
logits, which is what the rollback tests need. See its docstring for a known limitation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from specli_synth.fixtures import FIXTURE_DRAFT, FIXTURE_TARGET, fixture_vocab, reseed
from specli_synth.gguf_writer import WeightDType, add_spm_vocab, open_writer, write_tensors
from specli_synth.ngram_model import SynthModelConfig, config_factors, ngram_llama_weights, random_matrix
from specli_synth.vocab import TrainedVocab, Vocab

LayerKind = Literal["conv", "attn"]


@dataclass(frozen=True)
class Lfm2Spec:
    """Hyperparameters of an LFM2 model: a short-convolution or attention block per layer."""

    n_vocab: int
    n_embd: int
    n_ff: int
    layers: tuple[LayerKind, ...]
    n_head: int
    n_head_kv: int
    l_cache: int = 3  # convolution width: the state holds the previous l_cache - 1 inputs
    n_ctx_train: int = 4096
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    name: str = "specli-synth-lfm2"

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError("n_embd must be a multiple of n_head, n_head a multiple of n_head_kv")
        if self.l_cache < 2:
            raise ValueError("l_cache must be >= 2 (llama.cpp keeps l_cache - 1 inputs as state)")
        if set(self.layers) - {"conv", "attn"}:
            raise ValueError("layers are 'conv' or 'attn'")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF tensor names and numpy shapes (out, in), in file order (GGUF dims are reversed)."""
        d, hd, kv = self.n_embd, self.head_dim, self.n_head_kv * self.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (self.n_vocab, d),
            "token_embd_norm.weight": (d,),  # LFM2's final norm has this (historical) name
            "output.weight": (self.n_vocab, d),
        }
        for i, kind in enumerate(self.layers):
            shapes[f"blk.{i}.attn_norm.weight"] = (d,)
            if kind == "attn":
                shapes |= {
                    f"blk.{i}.attn_q_norm.weight": (hd,),
                    f"blk.{i}.attn_k_norm.weight": (hd,),
                    f"blk.{i}.attn_q.weight": (d, d),
                    f"blk.{i}.attn_k.weight": (kv, d),
                    f"blk.{i}.attn_v.weight": (kv, d),
                    f"blk.{i}.attn_output.weight": (d, d),
                }
            else:
                shapes |= {
                    f"blk.{i}.shortconv.conv.weight": (d, self.l_cache),
                    f"blk.{i}.shortconv.in_proj.weight": (3 * d, d),
                    f"blk.{i}.shortconv.out_proj.weight": (d, d),
                }
            shapes |= {
                f"blk.{i}.ffn_norm.weight": (d,),
                f"blk.{i}.ffn_gate.weight": (self.n_ff, d),
                f"blk.{i}.ffn_up.weight": (self.n_ff, d),
                f"blk.{i}.ffn_down.weight": (d, self.n_ff),
            }
        return shapes


def write_lfm2_gguf(
    path: str | Path,
    spec: Lfm2Spec,
    vocab: Vocab,
    weights: Mapping[str, np.ndarray | Callable[[], np.ndarray]],
    *,
    dtype: WeightDType = "f32",
) -> Path:
    """Write an ``lfm2``-architecture GGUF file (every tensor of :meth:`Lfm2Spec.tensor_shapes`).

    1-D tensors and the convolution kernels are stored as F32 (llama.cpp's ssm_conv wants F32),
    other matrices as *dtype*. The vocabulary is written as
    :func:`specli_synth.gguf_writer.write_llama_gguf` writes it.
    """

    def keys(writer: Any, arch: str) -> None:
        writer.add_block_count(len(spec.layers))
        writer.add_feed_forward_length(spec.n_ff)
        writer.add_head_count(spec.n_head)
        # LFM2 tells convolution layers from attention layers by a zero KV head count.
        writer.add_head_count_kv([spec.n_head_kv if k == "attn" else 0 for k in spec.layers])
        writer.add_rope_freq_base(spec.rope_theta)
        writer.add_layer_norm_rms_eps(spec.rms_eps)
        writer.add_uint32(f"{arch}.shortconv.l_cache", spec.l_cache)

    return _write_gguf(path, "lfm2", spec.name, spec.n_vocab, spec.n_embd, spec.n_ctx_train, keys,
                       vocab, spec.tensor_shapes(), weights, dtype, f32_marker=".shortconv.conv.")


def _write_gguf(
    path: str | Path,
    arch: str,
    name: str,
    n_vocab: int,
    n_embd: int,
    n_ctx_train: int,
    keys: Callable[[Any, str], None],
    vocab: Vocab,
    shapes: dict[str, tuple[int, ...]],
    weights: Mapping[str, np.ndarray | Callable[[], np.ndarray]],
    dtype: WeightDType,
    f32_marker: str,
) -> Path:
    """The common part: general keys, *keys(writer, arch)*, the vocabulary, then the tensors (1-D
    ones and those whose name contains *f32_marker* as F32, the rest as *dtype*)."""
    if len(vocab) != n_vocab:
        raise ValueError(f"vocabulary has {len(vocab)} tokens but the spec's n_vocab is {n_vocab}")
    if set(weights) != set(shapes):
        raise ValueError(
            f"weights do not match spec: missing {sorted(set(shapes) - set(weights))[:5]}, "
            f"unknown {sorted(set(weights) - set(shapes))[:5]}"
        )
    path = Path(path)
    writer, partial = open_writer(path, arch, name, n_vocab, dtype)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    keys(writer, arch)

    add_spm_vocab(writer, vocab)

    stored: dict[str, WeightDType] = {
        n: ("f32" if len(shape) == 1 or f32_marker in n else dtype) for n, shape in shapes.items()
    }
    return write_tensors(writer, path, partial, shapes, stored, weights)


def ngram_lfm2_weights(
    spec: Lfm2Spec, trained: TrainedVocab, config: SynthModelConfig
) -> dict[str, Callable[[], np.ndarray]]:
    """Lazy LFM2 weights with the token statistics of the llama fixture built from *config*.

    *spec* must have config's widths, a "conv" layer 0 and an "attn" layer 1 when config has
    skip-bigram factors / seen dims. See the module docstring for what each layer does.
    """
    if config.induction:
        raise ValueError("the LFM2 writer does not build the induction (copying) layers")
    if config.skip_rank and spec.layers[0] != "conv":
        raise ValueError("skip-bigram factors need a convolution as layer 0")
    if config.seen_dims and (len(spec.layers) < 2 or spec.layers[1] != "attn"):
        raise ValueError("seen dims need attention as layer 1")
    factors = config_factors(trained, config)
    llama_spec = config.spec(spec.n_vocab, spec.n_ctx_train)
    llama = ngram_llama_weights(llama_spec, factors, config, bos_id=trained.vocab.bos_id)
    weights: dict[str, Callable[[], np.ndarray]] = {
        "token_embd.weight": llama["token_embd.weight"],
        "token_embd_norm.weight": llama["output_norm.weight"],
        "output.weight": llama["output.weight"],
    }
    rank, skip_rank = factors.next_row.shape[1], factors.skip_row.shape[1]
    const_dim = rank + 2 * skip_rank + 2 * config.seen_dims  # the embedding's constant-1 dim
    if skip_rank:
        weights |= _previous_token_conv(spec, 0, rank, rank + skip_rank, skip_rank, const_dim)
    if config.seen_dims:
        # the llama fixture's uniform head: zero queries and keys stay zero through q/k RMS norms
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            weights[f"blk.1.{part}.weight"] = llama[f"blk.1.{part}.weight"]
    for i in range(min(2, len(spec.layers))):
        for part in ("ffn_gate", "ffn_up", "ffn_down"):
            weights[f"blk.{i}.{part}.weight"] = llama[f"blk.{i}.{part}.weight"]
    gains = {"attn_q": 1.0, "attn_k": 1.0, "attn_v": 1.0, "attn_output": config.noise_gain,
             "in_proj": 1.0, "out_proj": config.noise_gain, "conv": 1.0 / np.sqrt(spec.l_cache),
             "ffn_gate": 1.0, "ffn_up": 1.0, "ffn_down": config.noise_gain / 0.6}
    for name, shape in spec.tensor_shapes().items():
        if name in weights:
            continue
        if len(shape) == 1:
            weights[name] = lambda n=shape[0]: np.ones(n, dtype=np.float32)
            continue
        kind = name.split(".")[-2]
        weights[name] = random_matrix(shape, gains[kind] / np.sqrt(shape[1]), config.seed, name)
    return weights


def _previous_token_conv(
    spec: Lfm2Spec, layer: int, src: int, dst: int, width: int, const_dim: int
) -> dict[str, Callable[[], np.ndarray]]:
    """A short convolution that adds the previous token's dims src..src+width at dst..dst+width.

    LFM2's block: (b, c, x) = in_proj(h); y = c * conv(b * x); out = out_proj(y). Here b = c = 1
    (read from the constant dim), x = the source dims, and the kernel picks the previous input.
    """
    d, taps = spec.n_embd, spec.l_cache

    def in_proj() -> np.ndarray:
        m = np.zeros((3 * d, d), dtype=np.float32)
        for i in range(width):
            m[src + i, const_dim] = 1.0  # b
            m[d + src + i, const_dim] = 1.0  # c
            m[2 * d + src + i, src + i] = 1.0  # x
        return m

    def conv() -> np.ndarray:
        k = np.zeros((d, taps), dtype=np.float32)
        k[src : src + width, taps - 2] = 1.0  # tap taps - 1 is the current input, taps - 2 the one before
        return k

    def out_proj() -> np.ndarray:
        m = np.zeros((d, d), dtype=np.float32)
        m[dst + np.arange(width), src + np.arange(width)] = 1.0
        return m

    return {
        f"blk.{layer}.shortconv.in_proj.weight": in_proj,
        f"blk.{layer}.shortconv.conv.weight": conv,
        f"blk.{layer}.shortconv.out_proj.weight": out_proj,
    }


def write_ngram_lfm2(
    path: str | Path,
    trained: TrainedVocab,
    config: SynthModelConfig,
    layers: Sequence[LayerKind] = ("conv", "attn"),
    *,
    dtype: WeightDType = "f32",
) -> Path:
    """Write an LFM2 model of *trained*'s vocabulary with *config*'s widths and token statistics."""
    spec = Lfm2Spec(
        n_vocab=len(trained.vocab),
        n_embd=config.n_embd,
        n_ff=config.n_ff,
        layers=tuple(layers),
        n_head=config.n_head,
        n_head_kv=config.n_head_kv,
        rope_theta=config.rope_theta,
        name=config.name.replace("fixture", "fixture-lfm2"),
    )
    return write_lfm2_gguf(path, spec, trained.vocab, ngram_lfm2_weights(spec, trained, config), dtype=dtype)


@dataclass(frozen=True)
class HybridFixtureModels:
    """Tiny hybrid models with the fixture vocabulary (the llama fixtures' token statistics)."""

    target: Path  # LFM2 with FIXTURE_TARGET's statistics: conv, attn, conv, attn
    draft: Path  # LFM2 with FIXTURE_DRAFT's statistics: conv, attn
    qwen35: Path  # Qwen3.5 with FIXTURE_TARGET's widths and bigram statistics: 3 delta-net layers, attn


def build_hybrid_fixture_models(directory: str | Path, *, seed: int = 0) -> HybridFixtureModels:
    """Write the hybrid fixtures into *directory* (deterministic for a seed)."""
    directory = Path(directory)
    trained = fixture_vocab()
    target = write_ngram_lfm2(
        directory / "fixture-lfm2-target.gguf",
        trained,
        reseed(FIXTURE_TARGET, seed),
        ("conv", "attn", "conv", "attn"),
    )
    draft = write_ngram_lfm2(
        directory / "fixture-lfm2-draft.gguf",
        trained,
        reseed(FIXTURE_DRAFT, seed),
    )
    qwen35 = write_ngram_qwen35(
        directory / "fixture-qwen35-target.gguf",
        trained,
        reseed(FIXTURE_TARGET, seed),
    )
    return HybridFixtureModels(target, draft, qwen35)


# -----------------------------------------------------------------------------------------------------
# Qwen3.5: gated delta-net (linear attention) layers + gated full attention every 4th layer
# -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Qwen35Spec:
    """Hyperparameters of a Qwen3.5 (dense) model. Layers whose index i has (i + 1) % interval != 0
    are gated delta-net layers (recurrent state: a conv window and a head_dim x head_dim matrix per
    value head), the others gated full attention."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ssm_k_heads: int  # linear attention key heads (ssm.group_count)
    ssm_v_heads: int  # linear attention value heads (ssm.time_step_rank)
    ssm_conv: int = 4  # conv kernel width
    full_attention_interval: int = 4
    n_ctx_train: int = 4096
    rope_theta: float = 10000000.0
    rms_eps: float = 1e-6
    name: str = "specli-synth-qwen35"

    def __post_init__(self) -> None:
        if self.ssm_v_heads % self.ssm_k_heads or self.n_head % self.n_head_kv:
            raise ValueError("value heads must be a multiple of key heads, n_head of n_head_kv")
        if self.head_dim % 8:
            raise ValueError("head_dim must be a multiple of 8 (four rope sections)")

    def is_recurrent(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval != 0

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF tensor names and numpy shapes (out, in), in file order."""
        d = self.n_embd
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (self.n_vocab, d),
            "output_norm.weight": (d,),
            "output.weight": (self.n_vocab, d),
        }
        for i in range(self.n_layer):
            shapes |= self.layer_shapes(i, recurrent=self.is_recurrent(i))
        return shapes

    def layer_shapes(self, i: int, *, recurrent: bool) -> dict[str, tuple[int, ...]]:
        """Block i's tensors: a gated delta-net layer when *recurrent*, else gated attention (the
        layout an MTP block shares)."""
        d, hd = self.n_embd, self.head_dim
        key_dim, value_dim = hd * self.ssm_k_heads, hd * self.ssm_v_heads
        shapes: dict[str, tuple[int, ...]] = {
            f"blk.{i}.attn_norm.weight": (d,), f"blk.{i}.post_attention_norm.weight": (d,)
        }
        if recurrent:
            shapes |= {
                f"blk.{i}.attn_qkv.weight": (2 * key_dim + value_dim, d),
                f"blk.{i}.attn_gate.weight": (value_dim, d),
                f"blk.{i}.ssm_conv1d.weight": (2 * key_dim + value_dim, self.ssm_conv),
                f"blk.{i}.ssm_dt.bias": (self.ssm_v_heads,),
                f"blk.{i}.ssm_a": (self.ssm_v_heads,),
                f"blk.{i}.ssm_beta.weight": (self.ssm_v_heads, d),
                f"blk.{i}.ssm_alpha.weight": (self.ssm_v_heads, d),
                f"blk.{i}.ssm_norm.weight": (hd,),
                f"blk.{i}.ssm_out.weight": (d, value_dim),
            }
        else:
            shapes |= {
                f"blk.{i}.attn_q.weight": (2 * hd * self.n_head, d),  # queries and their gates
                f"blk.{i}.attn_k.weight": (hd * self.n_head_kv, d),
                f"blk.{i}.attn_v.weight": (hd * self.n_head_kv, d),
                f"blk.{i}.attn_output.weight": (d, hd * self.n_head),
                f"blk.{i}.attn_q_norm.weight": (hd,),
                f"blk.{i}.attn_k_norm.weight": (hd,),
            }
        return shapes | {
            f"blk.{i}.ffn_gate.weight": (self.n_ff, d),
            f"blk.{i}.ffn_up.weight": (self.n_ff, d),
            f"blk.{i}.ffn_down.weight": (d, self.n_ff),
        }


def add_qwen35_keys(writer: Any, arch: str, spec: Qwen35Spec, *, mtp_layers: int = 0) -> None:
    """The ``qwen35`` hyperparameter keys of *spec*; *mtp_layers* MTP (NextN) blocks count as blocks
    after the trunk's."""
    writer.add_block_count(spec.n_layer + mtp_layers)
    if mtp_layers:
        writer.add_uint32(f"{arch}.nextn_predict_layers", mtp_layers)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_rope_dimension_count(spec.head_dim)
    quarter = spec.head_dim // 8  # rope pairs per section: text positions use them all alike
    writer.add_array(f"{arch}.rope.dimension_sections", [quarter * 2, quarter, quarter, 0])
    writer.add_rope_freq_base(spec.rope_theta)
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    writer.add_uint32(f"{arch}.ssm.conv_kernel", spec.ssm_conv)
    writer.add_uint32(f"{arch}.ssm.inner_size", spec.head_dim * spec.ssm_v_heads)
    writer.add_uint32(f"{arch}.ssm.state_size", spec.head_dim)
    writer.add_uint32(f"{arch}.ssm.time_step_rank", spec.ssm_v_heads)
    writer.add_uint32(f"{arch}.ssm.group_count", spec.ssm_k_heads)
    writer.add_uint32(f"{arch}.full_attention_interval", spec.full_attention_interval)


def write_qwen35_gguf(
    path: str | Path,
    spec: Qwen35Spec,
    vocab: Vocab,
    weights: Mapping[str, np.ndarray | Callable[[], np.ndarray]],
    *,
    dtype: WeightDType = "f32",
) -> Path:
    """Write a ``qwen35``-architecture GGUF file (every tensor of :meth:`Qwen35Spec.tensor_shapes`)."""

    def keys(writer: Any, arch: str) -> None:
        add_qwen35_keys(writer, arch, spec)

    return _write_gguf(path, "qwen35", spec.name, spec.n_vocab, spec.n_embd, spec.n_ctx_train, keys,
                       vocab, spec.tensor_shapes(), weights, dtype, f32_marker=".ssm_conv1d.")


def ngram_qwen35_weights(
    spec: Qwen35Spec, trained: TrainedVocab, config: SynthModelConfig, *, mixer_gain: float = 0.3
) -> dict[str, Callable[[], np.ndarray]]:
    """Embedding, final norm and output rows of the llama fixture built from *config* (bigram and
    unigram logits; skip-bigram rows unused), every block random: the delta-net and attention outputs
    add *mixer_gain* rms to the residual, so the context (and the recurrent state) moves the logits."""
    llama_config = replace(config, skip_rank=0, seen_dims=0, induction=0.0)
    factors = config_factors(trained, llama_config)
    llama = ngram_llama_weights(llama_config.spec(spec.n_vocab, spec.n_ctx_train), factors, llama_config,
                                bos_id=trained.vocab.bos_id)
    weights: dict[str, Callable[[], np.ndarray]] = {
        "token_embd.weight": llama["token_embd.weight"],
        "output_norm.weight": llama["output_norm.weight"],
        "output.weight": llama["output.weight"],
    }
    out_gain = {"ssm_out": mixer_gain, "attn_output": mixer_gain, "ffn_down": config.noise_gain / 0.6}
    for name, shape in spec.tensor_shapes().items():
        if name in weights:
            continue
        kind = name.split(".")[2]  # blk.{i}.KIND[.weight|.bias]
        # Decay per token g = ssm_a * softplus(alpha + dt) ~ -0.03..-0.15 as in trained models. A strong
        # decay (g ~ -1.4 with dt = 0) made llama.cpp's chunked delta-net output NaN after ~40 tokens.
        if kind == "ssm_a":  # -exp(A_log): a decay rate per value head
            weights[name] = lambda n=shape[0]: -np.linspace(0.5, 2.0, n, dtype=np.float32)
        elif kind == "ssm_dt":
            weights[name] = lambda n=shape[0]: np.full(n, -3.0, dtype=np.float32)
        elif len(shape) == 1:
            weights[name] = lambda n=shape[0]: np.ones(n, dtype=np.float32)
        else:
            gain = out_gain.get(kind, 1.0)
            weights[name] = random_matrix(shape, gain / np.sqrt(shape[1]), config.seed, name)
    return weights


def write_ngram_qwen35(
    path: str | Path, trained: TrainedVocab, config: SynthModelConfig, n_layer: int = 4,
    *, dtype: WeightDType = "f32",
) -> Path:
    """Write a Qwen3.5 model of *trained*'s vocabulary with *config*'s widths (3 delta-net layers,
    then attention, repeated)."""
    head_dim = config.n_embd // config.n_head
    spec = Qwen35Spec(
        n_vocab=len(trained.vocab),
        n_embd=config.n_embd,
        n_layer=n_layer,
        n_ff=config.n_ff,
        n_head=config.n_head,
        n_head_kv=config.n_head_kv,
        head_dim=head_dim,
        ssm_k_heads=config.n_head_kv,
        ssm_v_heads=config.n_head,
        name=config.name.replace("fixture", "fixture-qwen35"),
    )
    return write_qwen35_gguf(path, spec, trained.vocab, ngram_qwen35_weights(spec, trained, config),
                             dtype=dtype)
