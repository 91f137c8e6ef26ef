"""Resident memory over a long speculative generation: it should stay flat (no per-round growth).

    python lab/memory_soak.py TARGET.gguf DRAFT.gguf [-n 10000]

Prints RSS every 1,000 generated tokens (Linux: /proc/self/statm).
"""

from __future__ import annotations

import argparse
import os

from specli import GenerationParams, SamplingParams, TokenEvent, load


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("-n", type=int, default=10_000)
    ap.add_argument("-t", "--threads", type=int, default=1)
    args = ap.parse_args()
    params = GenerationParams(
        max_tokens=args.n, sampling=SamplingParams(temperature=1.0), seed=1, draft_max=4, ignore_eos=True
    )
    print(f"before load: {rss_mib():.1f} MiB")
    with load(args.target, args.draft, n_ctx=args.n + 64, n_threads=args.threads) as spec:
        print(f"loaded: {rss_mib():.1f} MiB")
        n = 0
        generation = spec.generate("Once upon a time", params)
        for event in generation:
            if isinstance(event, TokenEvent):
                n += 1
                if n % 1000 == 0:
                    print(f"{n:6d} tokens: {rss_mib():.1f} MiB", flush=True)
        stats = generation.stats
        print(f"done: {stats.n_generated} tokens, {stats.rounds} rounds, {rss_mib():.1f} MiB")
    print(f"after close: {rss_mib():.1f} MiB")


if __name__ == "__main__":
    main()
