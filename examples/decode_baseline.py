"""How close does specli's plain path come to llama.cpp's own decode rate? Measured in one process.

    python examples/decode_baseline.py TARGET.gguf [DRAFT.gguf] [-n 128] [--repeat 5] [-t THREADS]

Interleaves, per repeat:
  1. llama.cpp alone: a ctypes loop of llama_batch_get_one + llama_decode + llama.cpp's own greedy
     sampler (llama_sampler_sample), no numpy, nothing else: the rate llama.cpp itself reaches.
  2. `specli --no-draft` (the engine with no drafter), greedy.
  3. with DRAFT: the engine at k=4 greedy, reporting the share of wall time outside llama_decode.
Prints the medians and the ratio of 2 to 1 measured in the same repeats.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import llama_cpp as llc

from specli import GenerationParams, SamplingParams, load
from specli.llama import Model, ModelOptions

PROMPT = "The function returns"


def llama_cpp_rate(model: Model, prompt: list[int], n: int) -> float:
    """Tokens/s of a bare llama.cpp greedy loop on `model`'s context (cache cleared first)."""
    model.reset()
    ctx = model._ctx  # the example measures llama.cpp directly, below specli's layer
    sampler = llc.llama_sampler_init_greedy()
    try:
        arr = (llc.llama_token * len(prompt))(*prompt)
        if llc.llama_decode(ctx, llc.llama_batch_get_one(arr, len(prompt))) != 0:
            raise RuntimeError("prompt decode failed")
        token = llc.llama_sampler_sample(sampler, ctx, -1)
        one = (llc.llama_token * 1)()
        one_ptr = ctypes.cast(one, ctypes.POINTER(llc.llama_token))
        start = time.perf_counter()
        for _ in range(n):
            one[0] = token
            if llc.llama_decode(ctx, llc.llama_batch_get_one(one_ptr, 1)):
                raise RuntimeError("decode failed")
            token = llc.llama_sampler_sample(sampler, ctx, -1)
        return n / (time.perf_counter() - start)
    finally:
        llc.llama_sampler_free(sampler)
        llc.llama_memory_clear(llc.llama_get_memory(ctx), True)
        model.tokens.clear()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("draft", nargs="?")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=0)
    args = ap.parse_args()

    greedy = GenerationParams(max_tokens=args.n, sampling=SamplingParams(temperature=0.0), seed=0)
    plain = load(args.target, None, n_ctx=1024, n_threads=args.threads)
    raw_model = Model(args.target, ModelOptions(n_ctx=1024, n_threads=args.threads))
    spec = load(args.target, args.draft, n_ctx=1024, n_threads=args.threads) if args.draft else None
    prompt = plain.tokenize(PROMPT)
    # Warm-up: first decodes allocate compute buffers.
    llama_cpp_rate(raw_model, prompt, 8)
    list(plain.generate(prompt, GenerationParams(max_tokens=8, sampling=greedy.sampling)))

    raw, ours, ratios, spec_rates, overheads = [], [], [], [], []
    for _ in range(args.repeat):
        r = llama_cpp_rate(raw_model, prompt, args.n)
        plain.engine.reset()
        stats = plain.generate(prompt, greedy).complete().stats
        p = stats.n_generated / stats.generation_seconds
        raw.append(r)
        ours.append(p)
        ratios.append(p / r)
        if spec:
            spec.engine.reset()
            k4 = GenerationParams(max_tokens=args.n, sampling=greedy.sampling, draft_max=4)
            stats = spec.generate(prompt, k4).complete().stats
            spec_rates.append(stats.tokens_per_second)
            overheads.append(stats.overhead_fraction)
        print(f"llama.cpp {r:7.2f} tok/s   specli --no-draft {p:7.2f} tok/s   ratio {p / r:.3f}", flush=True)
    med = statistics.median
    print(
        f"median: llama.cpp {med(raw):.2f} tok/s, specli --no-draft {med(ours):.2f} tok/s, "
        f"ratio {med(ratios):.3f} (min {min(ratios):.3f})"
    )
    if spec:
        print(
            f"speculative k=4: {med(spec_rates):.2f} tok/s, time outside llama_decode "
            f"{100 * med(overheads):.2f} % (max {100 * max(overheads):.2f} %)"
        )


if __name__ == "__main__":
    main()
