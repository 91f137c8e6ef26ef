"""What a thread count far above the cores costs: the time of one single-token decode at several -t values,
on the test fixture's target (built here) or a model given as the first argument. This is what specli's
bound on --threads (settings.THREADS_PER_CORE per usable core) rests on.

Each measurement runs in its own process (llama.cpp's OpenMP workers outlive a decode and keep spinning,
so a 512-thread decode would slow whatever the same process did next), the thread counts rotated per
round; each process reports the median of its timed decodes, and the table the median over rounds.

    python lab/thread_count.py [MODEL.gguf] [--rounds 5] [--threads 1,2,4,8,16,64,512]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specli.settings import usable_cores

DECODES = 7


def child(model: str, threads: int) -> None:
    from specli.llama import Model, ModelOptions

    with Model(model, ModelOptions(n_ctx=256, n_threads=threads)) as m:
        prompt = m.tokenize("Once upon a time")
        m.decode(prompt, outputs="last")  # builds the graph
        times = []
        for _ in range(DECODES):
            t0 = time.perf_counter()
            m.decode(prompt[-1:], outputs="last")
            times.append(time.perf_counter() - t0)
            m.truncate(len(prompt))
    print(statistics.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="a .gguf model (default: the test fixture's target)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", default="1,2,4,8,16,64,512")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.model, args.child)
        return
    counts = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else _fixture_target(Path(tmp))
        times: dict[int, list[float]] = {t: [] for t in counts}
        for r in range(args.rounds):
            for t in counts[r % len(counts):] + counts[: r % len(counts)]:
                out = subprocess.run([sys.executable, __file__, str(path), "--child", str(t)],
                                     capture_output=True, text=True, check=True, timeout=3600)
                times[t].append(float(out.stdout))
    print(f"{path.name}, {usable_cores()} usable cores, one process per measurement, median of "
          f"{args.rounds} rounds x median of {DECODES} decodes")
    for t in counts:
        print(f"  -t {t:>4}: {1000 * statistics.median(times[t]):9.3f} ms per token")


def _fixture_target(directory: Path) -> Path:
    from specli_synth.fixtures import build_fixture_models

    return build_fixture_models(directory).target


if __name__ == "__main__":
    main()
