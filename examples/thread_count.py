"""What a thread count far above the cores costs: the median time of one single-token decode at several
-t values, interleaved (one decode of each count per round, rounds repeated), on the test fixture's
target (built here) or a model given as the first argument. This is what specli's bound on --threads
(settings.THREADS_PER_CORE per usable core) rests on.

    python examples/thread_count.py [MODEL.gguf] [--rounds 15] [--threads 1,2,4,8,16,64,512]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from specli.llama import Model, ModelOptions
from specli.settings import usable_cores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="a .gguf model (default: the test fixture's target)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", default="1,2,4,8,16,64,512")
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else _fixture_target(Path(tmp))
        models = {t: Model(path, ModelOptions(n_ctx=256, n_threads=t)) for t in counts}
        times: dict[int, list[float]] = {t: [] for t in counts}
        prompt = models[counts[0]].tokenize("Once upon a time")
        for model in models.values():  # first decodes build the graphs
            model.decode(prompt, outputs="last")
        for _ in range(args.rounds):
            for t, model in models.items():
                t0 = time.perf_counter()
                model.decode(prompt[-1:], outputs="last")
                times[t].append(time.perf_counter() - t0)
                model.truncate(len(prompt))
        for model in models.values():
            model.close()
    print(f"{path.name}, {usable_cores()} usable cores, median of {args.rounds} interleaved decodes")
    for t in counts:
        print(f"  -t {t:>4}: {1000 * statistics.median(times[t]):8.3f} ms per token")


def _fixture_target(directory: Path) -> Path:
    from specli_synth.fixtures import build_fixture_models

    return build_fixture_models(directory).target


if __name__ == "__main__":
    main()
