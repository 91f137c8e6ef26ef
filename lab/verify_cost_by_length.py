"""What a verify batch costs as the context grows: the target's decode of m tokens (logits for every row,
as a verify asks) after L tokens already in its cache, for several m and L. This is what specli's cost
model (specli.costs.attention_slopes) fits from the rounds it runs; lab/history.md quotes a run.

    python lab/verify_cost_by_length.py MODEL.gguf [--sizes 1,2,4,8] [--lengths 16,512,2048]
        [-t 2] [--repeats 7]

Each cell is the median of `--repeats` decodes after one untimed one (the first decode of a size
builds llama.cpp's graph), the cache truncated back to L after each. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

from specli.llama import Model, ModelOptions


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--sizes", type=_ints, default=[1, 2, 4, 8], help="batch sizes m (comma-separated)")
    ap.add_argument("--lengths", type=_ints, default=[16, 512, 2048], help="cached tokens L before a batch")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    longest = max(args.lengths) + max(args.sizes)
    with Model(args.model, ModelOptions(n_ctx=longest + 16, n_threads=args.threads)) as target:
        # Ordinary ids from the middle of the vocabulary: the cost of a decode does not depend on them.
        filler = [(i * 7919) % 1000 + 100 for i in range(longest)]
        print("L \\ m".rjust(8) + "".join(f"{m:>9}" for m in args.sizes) + "   (ms)")
        for length in args.lengths:
            target.reset()
            target.decode(filler[:length], outputs="none")
            row = []
            for m in args.sizes:
                batch = filler[length:length + m]
                times = []
                for _ in range(args.repeats + 1):
                    t0 = time.perf_counter()
                    target.decode(batch, outputs="all")
                    times.append(time.perf_counter() - t0)
                    target.truncate(length)
                row.append(statistics.median(times[1:]) * 1e3)
            print(f"{length:>8}" + "".join(f"{ms:>9.1f}" for ms in row), flush=True)


if __name__ == "__main__":
    main()
