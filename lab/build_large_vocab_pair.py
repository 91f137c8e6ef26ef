"""Write a large-vocabulary target and a weak draft (Q8_0), for measuring where speculation cannot pay.

    python lab/build_large_vocab_pair.py DIR [--vocab 151936] [--agreement 0.55] [--shape qwen2|gemma3]

The target has Qwen2-0.5B's shape (896 wide, 24 layers, 14 query / 2 KV heads, FFN 4864) and a
151,936-token vocabulary (Qwen2's size), ~630M weights in Q8_0; the draft is 128 wide with 2 layers
(~39M weights). `--shape gemma3` gives the target Gemma 3 270M's size instead (640 wide, 18 layers,
4 query / 1 KV heads, FFN 2048) and by default its 262,144-token vocabulary, files gemma-shaped-*.gguf:
a llama-architecture stand-in for Gemma where the real file cannot travel (a lent GPU). Neither is
trained: the target's layers are near-identity, so its next-token
distribution is a fixed function of the last token (a random bigram model of rank 128, its top token
~0.3 likely), and the draft holds the same bigram with noise mixed into its output rows, so it agrees
with the target only partly: sampled acceptance at T = 1 is about 0.5-0.6 with the defaults. Speed
and acceptance are what these models are for, not text (the vocabulary is byte tokens plus synthetic
pieces). Needs specli-synth (./synth).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from specli_synth.gguf_writer import LlamaSpec, write_llama_gguf
from specli_synth.vocab import piece_vocab


def weights(spec: LlamaSpec, embed: np.ndarray, out: np.ndarray, seed: int) -> dict:
    """Near-identity layers (tiny random matrices), unit norms, the given embedding and output."""
    rng = np.random.default_rng(seed)
    w: dict = {"token_embd.weight": embed, "output.weight": out,
               "output_norm.weight": np.ones(spec.n_embd, np.float32)}
    for name, shape in spec.tensor_shapes().items():
        if name in w:
            continue
        if len(shape) == 1:
            w[name] = np.ones(shape, np.float32)
        else:
            w[name] = (lambda s=shape: (0.002 * rng.standard_normal(s)).astype(np.float32))
    return w


RANK = 128  # the draft's width, and the subspace the target's embeddings and outputs live in


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory", type=Path)
    ap.add_argument("--shape", choices=("qwen2", "gemma3"), default="qwen2",
                    help="the target's size: Qwen2-0.5B's (default) or Gemma 3 270M's")
    ap.add_argument("--vocab", type=int, default=None, help="default: 151936 (qwen2), 262144 (gemma3)")
    ap.add_argument("--agreement", type=float, default=0.9,
                    help="share of the draft's output rows that is the target's (0.9: ~0.5-0.6 accepted)")
    ap.add_argument("--sigma", type=float, default=4.0, help="spread of the target's logits (top token ~0.3)")
    opts = ap.parse_args()
    gemma = opts.shape == "gemma3"
    opts.vocab = opts.vocab or (262_144 if gemma else 151_936)
    prefix = "gemma-shaped" if gemma else "large-vocab"
    opts.directory.mkdir(parents=True, exist_ok=True)
    vocab = piece_vocab(opts.vocab)
    rng = np.random.default_rng(0)
    if gemma:
        target = LlamaSpec(n_vocab=opts.vocab, n_embd=640, n_layer=18, n_head=4, n_head_kv=1, n_ff=2048,
                           name="gemma-shaped-target")
    else:
        target = LlamaSpec(n_vocab=opts.vocab, n_embd=896, n_layer=24, n_head=14, n_head_kv=2, n_ff=4864,
                           name="large-vocab-target")
    draft = LlamaSpec(n_vocab=opts.vocab, n_embd=RANK, n_layer=2, n_head=4, n_head_kv=2, n_ff=256,
                      name="large-vocab-weak-draft")
    # A random bigram model of rank RANK: after token x, logit_y = sigma <e_x, o_y> over unit vectors
    # (the RMS norm of the residual stream keeps e_x's direction). The target holds it in a RANK-wide
    # subspace of its 896 dimensions; the draft, RANK wide, holds it with its output rows mixed with
    # noise, so it agrees only partly.
    e0 = rng.standard_normal((opts.vocab, RANK)).astype(np.float32)
    o0 = rng.standard_normal((opts.vocab, RANK)).astype(np.float32)
    o0 /= np.linalg.norm(o0, axis=1, keepdims=True)
    basis = np.linalg.qr(rng.standard_normal((target.n_embd, RANK)))[0].T.astype(np.float32)  # RANK x 896
    scale = opts.sigma / np.sqrt(target.n_embd / RANK)
    write_llama_gguf(opts.directory / f"{prefix}-target.gguf", target, vocab,
                     weights(target, e0 @ basis, (scale * o0) @ basis, 1), dtype="q8_0")
    noise = rng.standard_normal(o0.shape).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    mixed = opts.agreement * o0 + (1 - opts.agreement) * noise
    mixed *= opts.sigma / np.linalg.norm(mixed, axis=1).mean()
    write_llama_gguf(opts.directory / f"{prefix}-draft.gguf", draft, vocab,
                     weights(draft, e0, mixed.astype(np.float32), 2), dtype="q8_0")
    print(f"wrote {opts.directory}/{prefix}-target.gguf and {prefix}-draft.gguf")


if __name__ == "__main__":
    main()
