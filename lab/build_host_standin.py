"""Write a 262,144-token model whose token costs at most ~0.5 ms on a 2-core CPU: a stand-in where
specli's host work per token (a 262k row to read and filter, the Python round) weighs what it weighs
beside a GPU's ~1 ms token.

    python lab/build_host_standin.py DIR [--vocab 262144] [--embd 32] [--sigma 7.5]

One near-identity llama layer, `--embd` wide (32: the output head is 262,144 x 32 in Q8_0, 8.9 MB, which
stays in a 32 MB L3 cache), file `host-standin-262k.gguf`. Like lab/build_large_vocab_pair.py's models it
is a random bigram model: after token x the logits are sigma <e_x, o_y> over unit vectors o_y (the layer's
RMS norm keeps e_x's direction), so its next-token distribution is a fixed function of the last token, and
`--sigma` sets how peaked it is. The script prints what llama.cpp's default filters (top-k 40, top-p 0.95,
min-p 0.05) leave of such rows, computed from the weights. Speed is what the file is for, not text.
Needs specli-synth (./synth).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from build_large_vocab_pair import weights

from specli_synth.gguf_writer import LlamaSpec, write_llama_gguf
from specli_synth.vocab import piece_vocab

NAME = "host-standin-262k.gguf"


def filtered_sizes(logits: np.ndarray) -> tuple[float, int]:
    """The top probability and the ids top-k 40 / top-p 0.95 / min-p 0.05 keep, of one row."""
    top = np.sort(logits)[::-1][:40].astype(np.float64)
    z = np.exp(top - top[0])
    p_all = 1.0 / np.exp(logits.astype(np.float64) - top[0]).sum()
    cum = np.cumsum(z) / z.sum()
    cut = min(int(np.searchsorted(cum, 0.95)) + 1, 40)
    kept = int((top[:cut] >= top[0] + np.log(0.05)).sum())
    return float(p_all), kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory", type=Path)
    ap.add_argument("--vocab", type=int, default=262_144)
    ap.add_argument("--embd", type=int, default=8, help="width (Q8_0: a multiple of 32)")
    ap.add_argument("--dtype", choices=("q8_0", "f16", "f32"), default="f32")
    ap.add_argument("--sigma", type=float, default=40.0,
                    help="spread of the logits (40: the top token ~0.3 likely)")
    opts = ap.parse_args()
    if opts.dtype == "q8_0" and opts.embd % 32:
        ap.error("--embd must be a multiple of 32 in Q8_0")
    opts.directory.mkdir(parents=True, exist_ok=True)
    spec = LlamaSpec(n_vocab=opts.vocab, n_embd=opts.embd, n_layer=1, n_head=1, n_head_kv=1,
                     n_ff=2 * opts.embd, name="host-standin-262k")
    rng = np.random.default_rng(0)
    embed = rng.standard_normal((opts.vocab, opts.embd)).astype(np.float32)
    out = rng.standard_normal((opts.vocab, opts.embd)).astype(np.float32)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    # The normed residual has norm sqrt(embd), so a logit is sigma <x, o_y> ~ N(0, sigma^2) over random pairs.
    out *= opts.sigma
    path = opts.directory / NAME
    write_llama_gguf(path, spec, piece_vocab(opts.vocab), weights(spec, embed, out, 1), dtype=opts.dtype)
    sample = rng.choice(opts.vocab, 64, replace=False)
    x = embed[sample] / np.sqrt((embed[sample] ** 2).mean(axis=1, keepdims=True))
    stats = [filtered_sizes(row) for row in x @ out.T]
    tops, kept = zip(*stats, strict=True)
    print(f"wrote {path} ({spec.n_params() / 1e6:.1f}M weights); over 64 rows the top token's probability "
          f"is {np.median(tops):.2f} (median) and the default filters keep {np.median(kept):.0f} ids "
          f"({min(kept)}-{max(kept)})")


if __name__ == "__main__":
    main()
