"""Acceptance of same-as-plain speculation against the classic rejection rule, on your pair.

    python examples/acceptance_modes.py TARGET.gguf DRAFT.gguf [--prompt TEXT ...] [--no-filters]

Fixed draft lengths, so that no timing decides anything: the figures are the same on a busy machine.
Same-as-plain accepts a drafted token only where it equals the target's own keyed draw (so the output
is plain decoding's); rejection sampling accepts with min(1, p/q). Both are exact; this shows what
the reproducible rule costs in acceptance.
"""

from __future__ import annotations

import argparse

from specli import GenerationParams, SamplingParams, load

DEFAULT_PROMPTS = (
    'def parse_args(argv):\n    """Parse the command line.',
    "The standard library provides",
    "Return a new list containing",
)


def acceptance(target: str, draft: str, prompts: list[str], sampling: SamplingParams, k: int,
               same_as_plain: bool, seeds: int, tokens: int, threads: int) -> float:
    accepted = drafted = 0
    with load(target, draft, n_ctx=1024, n_threads=threads) as spec:
        for seed in range(seeds):
            for prompt in prompts:
                params = GenerationParams(max_tokens=tokens, sampling=sampling, seed=seed, draft_max=k,
                                          same_as_plain=same_as_plain)
                stats = spec.generate(prompt, params).complete().stats
                accepted += stats.accepted
                drafted += stats.drafted
    return accepted / drafted if drafted else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--prompt", action="append", help="a prompt (repeatable; default: three built-in ones)")
    ap.add_argument("--no-filters", action="store_true", help="no top-k/top-p/min-p (default: 40/0.95/0.05)")
    ap.add_argument("-k", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--temp", type=float, nargs="+", default=[1.0, 0.7])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("-n", type=int, default=48, help="tokens per generation")
    ap.add_argument("-t", "--threads", type=int, default=0)
    args = ap.parse_args()
    prompts = args.prompt or list(DEFAULT_PROMPTS)
    print(f"{'T':>4} {'k':>3}  {'same-as-plain':>13}  {'rejection':>9}")
    filters = dict(top_k=40, top_p=0.95, min_p=0.05)
    if args.no_filters:
        filters = dict(top_k=0, top_p=1.0, min_p=0.0)
    for temp in args.temp:
        sampling = SamplingParams(temperature=temp, **filters)
        for k in args.k:
            same, classic = (
                acceptance(args.target, args.draft, prompts, sampling, k, mode, args.seeds, args.n,
                           args.threads)
                for mode in (True, False)
            )
            print(f"{temp:>4g} {k:>3}  {same:>13.3f}  {classic:>9.3f}", flush=True)


if __name__ == "__main__":
    main()
