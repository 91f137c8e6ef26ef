"""How big a synthetic model is and how the token statistics and the noise go into it: the record
:mod:`specli_synth.ngram_model` and :mod:`specli_synth.heads` both read (its own module, so neither
imports the other for it)."""

from __future__ import annotations

from dataclasses import dataclass

from specli_synth.gguf_writer import LlamaSpec


@dataclass(frozen=True)
class SynthModelConfig:
    """One synthetic model: llama shape plus how the token statistics and the noise go into it.

    Residual-stream layout of the embedding (width n_embd): ``rank`` dims of bigram factors,
    ``skip_rank`` dims of skip-bigram factors and as many that layer 0's previous-token attention
    fills, ``seen_dims`` dims of random token codes and as many that layer 1's uniform attention
    fills with the context's average code, one constant dim (carries the unigram bias), one
    norm-padding dim, then (with ``induction``) ``induction_dims`` dims of random match codes, as
    many that layer 2 fills with the previous token's match code, as many that layer 3 fills with
    the one before it, and a dim that is 1 only at BOS (the induction head's attention sink); zeros.
    """

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    rank: int  # bigram SVD rank
    skip_rank: int = 0  # skip-bigram rank read through a previous-token head; <= n_head_kv * head_dim
    skip_weight: float = 0.6
    seen_dims: int = 0  # width of the token codes behind the repetition penalty; <= n_head_kv * head_dim
    seen_penalty: float = 0.0  # logit penalty of a token that makes up the whole context so far
    sharpness: float = 1.0  # logit multiplier: >1 lowers the next-token entropy
    noise_gain: float = 0.05  # rms of each random block's residual contribution (the residual has rms ~1)
    data_fraction: float = 1.0  # share of the training documents counted (a draft sees less data)
    # Copying from the context, as real LMs do (layers 2-4, see ngram_llama_weights): when the last
    # two tokens occurred before, the model switches to copy mode: a copy vector `induction` times
    # the residual's norm takes over the final RMS norm, shrinking the n-gram logits about
    # sqrt(1 + induction^2)-fold, and the token that followed gets ~seen_penalty sqrt(n_embd) / |z|
    # nats. When only the current token occurred before, its successor gets `induction_single` nats.
    induction: float = 0.0
    induction_single: float = 0.0
    induction_dims: int = 16  # match-code width per token (2 * induction_dims + 4 <= head_dim)
    rope_theta: float = 10000.0
    seed: int = 0
    name: str = "specli-synth"

    def __post_init__(self) -> None:
        head_dim = self.n_embd // self.n_head
        kv_width = self.n_head_kv * head_dim
        used = self.rank + 2 * self.skip_rank + 2 * self.seen_dims + 2
        if self.induction:
            used += 3 * self.induction_dims + 1
        if used > self.n_embd:
            raise ValueError(
                "rank + 2 * skip_rank + 2 * seen_dims + 2 (+ 3 * induction_dims + 1 with induction) "
                f"must be <= n_embd ({self.n_embd})"
            )
        if self.skip_rank > kv_width or self.seen_dims > kv_width:
            raise ValueError(f"skip_rank and seen_dims must be <= n_head_kv * head_dim ({kv_width})")
        if self.seen_dims and self.n_layer < 2:
            raise ValueError("seen_dims needs n_layer >= 2 (the uniform head lives in layer 1)")
        if self.induction:
            if self.n_layer < 5 or self.n_head_kv < 2 or not 2 <= self.seen_dims <= head_dim:
                raise ValueError("induction needs n_layer >= 5, n_head_kv >= 2, 2 <= seen_dims <= head_dim")
            if 2 * self.induction_dims + 4 > head_dim:
                raise ValueError(f"induction_dims must be <= head_dim / 2 - 2 ({head_dim // 2 - 2})")

    def spec(self, n_vocab: int, n_ctx_train: int = 4096) -> LlamaSpec:
        return LlamaSpec(
            n_vocab=n_vocab,
            n_embd=self.n_embd,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_head_kv=self.n_head_kv,
            n_ff=self.n_ff,
            n_ctx_train=n_ctx_train,
            rope_theta=self.rope_theta,
            name=self.name,
        )
