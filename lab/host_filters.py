"""The host filters in C (specli/native_sampling.c) against numpy's, in one process (issue #51).

    python lab/host_filters.py MODEL.gguf [MODEL2.gguf ...] [-n 512] [--repeat 12] [--rows 900] [-t 2]

Per model:
a) per token, right after a decode (the caches as a generation finds them): the default sampling's
   filters and keyed draw with the C build, the same with numpy's, and T 0's argmax alone, one of the
   three after each decode in turn, over --rows decodes; medians in microseconds.
b) whole generations of -n tokens (the plain prompt, EOS ignored): T 0, the default sampling with the
   C filters, the same with numpy's, in turns, --repeat times; median tok/s and the median of each
   turn's ratio to T 0. Turns a second apart see the same phase of a machine whose speed moves.
numpy's path is what a machine without a C compiler runs (specli.sampling.native swapped out).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_llamacpp import PLAIN_PROMPT  # noqa: E402

from specli import GenerationParams, SamplingParams, load  # noqa: E402
from specli import sampling as sampling_module  # noqa: E402
from specli.llama import Model, ModelOptions  # noqa: E402
from specli.native import native, reason  # noqa: E402
from specli.sampling import DEFAULT_SAMPLING, Noise, distribution  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


def use_numpy(on: bool) -> None:
    sampling_module.native = (lambda: None) if on else native


def per_token(path: str, rows: int, threads: int) -> dict[str, float]:
    model = Model(path, ModelOptions(n_ctx=2048, n_threads=threads))
    try:
        tokens = model.tokenize(PLAIN_PROMPT)
        row = model.decode(tokens)[-1]
        noise, position = Noise(0), len(tokens)
        spent: dict[str, list[float]] = {"C": [], "numpy": [], "argmax": []}
        for i in range(rows):
            which = ("C", "numpy", "argmax")[i % 3]
            use_numpy(which == "numpy")
            t0 = time.perf_counter()
            if which == "argmax":
                int(row.argmax())
            else:
                distribution(row, DEFAULT_SAMPLING).draw(noise, position)
            spent[which].append(time.perf_counter() - t0)
            use_numpy(False)
            token = distribution(row, DEFAULT_SAMPLING).draw(noise, position)
            row = model.decode([token])[-1]
            position += 1
        return {k: statistics.median(v) * 1e6 for k, v in spent.items()}
    finally:
        use_numpy(False)
        model.close()


def generations(path: str, n: int, repeat: int, threads: int) -> dict[str, tuple[float, float]]:
    with load(path, None, n_ctx=2048, n_threads=threads) as spec:
        prompt = spec.tokenize(PLAIN_PROMPT)

        def rate(sampling: SamplingParams, seed: int, numpy_filters: bool) -> float:
            spec.engine.reset()
            use_numpy(numpy_filters)
            try:
                params = GenerationParams(max_tokens=n, sampling=sampling, seed=seed, ignore_eos=True,
                                          draft_max=0)
                return spec.generate(prompt, params).complete().stats.tokens_per_second or 0.0
            finally:
                use_numpy(False)

        runs = {"T 0": (GREEDY, False), "default, C": (DEFAULT_SAMPLING, False),
                "default, numpy": (DEFAULT_SAMPLING, True)}
        for sampling, numpy_filters in runs.values():  # warm-up
            rate(sampling, 0, numpy_filters)
        got: dict[str, list[float]] = {name: [] for name in runs}
        for rep in range(repeat):
            for name, (sampling, numpy_filters) in runs.items():
                got[name].append(rate(sampling, rep, numpy_filters))
        out = {}
        for name, rates in got.items():
            ratios = [r / g for r, g in zip(rates, got["T 0"], strict=True)]
            out[name] = (statistics.median(rates), statistics.median(ratios))
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("-n", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=12)
    ap.add_argument("--rows", type=int, default=900)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    print(f"host filters: {reason()}")
    for path in args.models:
        cost = per_token(path, args.rows, args.threads)
        print(f"{Path(path).name}: per token after a decode, filters + draw: C {cost['C']:.1f} µs, "
              f"numpy {cost['numpy']:.1f} µs; argmax alone {cost['argmax']:.1f} µs")
        for name, (rate, ratio) in generations(path, args.n, args.repeat, args.threads).items():
            print(f"  {name:15s} {rate:9.1f} tok/s   x T 0 {ratio:.3f}")


if __name__ == "__main__":
    main()
