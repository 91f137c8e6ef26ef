"""What host work costs right after a decode, against the same work warm (issue #51).

    python lab/after_decode.py MODEL.gguf [MODEL2.gguf ...] [--rows 300] [-n 1024] [--drafts 4] [-t 2]

A decode streams the model's weights and writes a row over the whole vocabulary, and on a CPU it
leaves the core's caches holding little of what Python touches next: each step after it costs several
times what it costs warm. Per model:
a) steps, one after each decode in turn (--rows decodes each), then each repeated on the last row with
   nothing between (warm); medians in microseconds: a Python call that does nothing, numpy's argmax
   of the row (a greedy round's), the C filter alone (specli_filter, top-k 40 / top-p 0.95 / min-p
   0.05), distribution() + Dist.draw (a drafted round's row), plain_token (a plain round's one call);
b) a plain generation's round (-n tokens, T 0 and the default sampling, EOS ignored), from its
   RoundEvents: medians of the draft (the proposer), verify less llama_decode (the batch and the
   decode call's Python), other (verify(), the token's events and text) and between (the events'
   way to the consumer, the stats, the loop) in microseconds, beside llama_decode's own time;
c) verify() of a same-as-plain round of --drafts drafts that are all accepted (plain decoding's own
   continuation, default sampling), right after its decode: its rows drawn as now (plain_token, one C
   call a row) and each through a Dist (as before), in turns; median microseconds a round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_llamacpp import PLAIN_PROMPT  # noqa: E402

from specli import GenerationParams, SamplingParams, load  # noqa: E402
from specli import verify as verify_module  # noqa: E402
from specli.drafters.base import Draft  # noqa: E402
from specli.events import RoundEvent  # noqa: E402
from specli.native import data_address, native  # noqa: E402
from specli.sampling import (  # noqa: E402
    DEFAULT_SAMPLING,
    Noise,
    Sampler,
    _filter_settings,
    distribution,
    masked_for,
    plain_token,
)


def steps(spec, rows: int) -> dict[str, tuple[float, float]]:
    """(after a decode, warm) medians in microseconds, per step."""
    model, lib = spec.target, native()
    noise, n = Noise(1), spec.target.n_vocab
    out = np.empty(4 * DEFAULT_SAMPLING.top_k + 1)
    settings = _filter_settings(DEFAULT_SAMPLING)[1]
    work = {
        "a Python call that does nothing": lambda rows: 0,
        "numpy's argmax (greedy)": lambda rows: int(rows[0].argmax()),
        "the C filter alone": None if lib is None or lib.filter is None else
        lambda rows: lib.filter(data_address(rows[0]), n, settings, data_address(out)),
        "distribution() + draw": lambda rows: distribution(rows[0], DEFAULT_SAMPLING).draw(noise, 7),
        "plain_token": lambda rows: plain_token(rows, DEFAULT_SAMPLING, noise, 7),
    }
    work = {name: f for name, f in work.items() if f is not None}
    prompt = spec.tokenize(PLAIN_PROMPT)
    after: dict[str, list[float]] = {name: [] for name in work}
    clock = time.perf_counter
    model.reset()
    model.decode(prompt[:-1], outputs="none")
    token = prompt[-1]
    for _ in range(rows):
        for name, f in work.items():
            if model.n_past + 2 > model.n_ctx:
                model.reset()
                model.decode(prompt[:-1], outputs="none")
            logits = model.decode([token], outputs="last")
            t0 = clock()
            f(logits)
            after[name].append(clock() - t0)
            token = int(logits[0].argmax())
    warm: dict[str, list[float]] = {name: [] for name in work}
    for name, f in work.items():
        for _ in range(50):
            t0 = clock()
            f(logits)
            warm[name].append(clock() - t0)
    return {name: (statistics.median(after[name]) * 1e6, statistics.median(warm[name]) * 1e6)
            for name in work}


def rounds(spec, n: int) -> dict[str, dict[str, float]]:
    prompt = spec.tokenize(PLAIN_PROMPT)
    out = {}
    for label, sampling in (("T 0", SamplingParams(temperature=0.0)), ("default sampling", DEFAULT_SAMPLING)):
        spec.engine.reset()
        params = GenerationParams(max_tokens=n, sampling=sampling, ignore_eos=True, seed=1, draft_max=0)
        events = [e for e in spec.generate(prompt, params) if isinstance(e, RoundEvent)]
        between = [b.elapsed_seconds - a.elapsed_seconds - (b.draft_seconds + b.verify_seconds
                                                            + b.other_seconds)
                   for a, b in zip(events, events[1:], strict=False)]
        parts = {
            "draft": [e.draft_seconds for e in events],
            "verify less llama_decode": [e.verify_seconds - e.decode_seconds for e in events],
            "other": [e.other_seconds for e in events],
            "between": between,
            "llama_decode": [e.decode_seconds for e in events],
        }
        out[label] = {name: statistics.median(v) * 1e6 for name, v in parts.items()}
    return out


def verify_rounds(spec, drafts: int, n: int) -> dict[str, float]:
    """(c): median microseconds of verify() a round, its rows drawn one call each and through a Dist."""
    model, seed = spec.target, 5
    prompt = spec.tokenize(PLAIN_PROMPT)
    spec.engine.reset()
    params = GenerationParams(max_tokens=n, sampling=DEFAULT_SAMPLING, ignore_eos=True, seed=seed,
                              draft_max=0)
    sequence = prompt + spec.generate(prompt, params).complete().tokens
    sampler = Sampler(DEFAULT_SAMPLING, Noise(seed), same_as_plain=True)

    def through_a_dist(rows, sampling, noise, position):
        return distribution(rows[0], masked_for(rows, sampling)).draw(noise, position)

    ways = {"one call a row": plain_token, "through a Dist": through_a_dist}
    spent: dict[str, list[float]] = {name: [] for name in ways}
    model.reset()
    model.decode(prompt[:-1], outputs="none")
    position, turn = len(prompt) - 1, 0
    try:
        while position + drafts + 1 < len(sequence):
            batch = sequence[position : position + drafts + 1]  # the pending token and its drafts
            rows = model.decode(batch, outputs="all")
            name = list(ways)[turn % 2]
            verify_module.plain_token = ways[name]
            t0 = time.perf_counter()
            verdict = verify_module.verify(rows, Draft(batch[1:], None, "plain's own"), sampler, position + 1)
            spent[name].append(time.perf_counter() - t0)
            if verdict.tokens != sequence[position + 1 : position + drafts + 2]:
                raise SystemExit("after_decode.py: error: a round did not print plain decoding's tokens")
            position += drafts + 1
            model.truncate(position)  # the batch's last token is the next round's pending one
            turn += 1
    finally:
        verify_module.plain_token = plain_token
    return {name: statistics.median(v) * 1e6 for name, v in spent.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--rows", type=int, default=300, help="decodes per step (a)")
    ap.add_argument("-n", type=int, default=1024, help="tokens per generation (b)")
    ap.add_argument("--drafts", type=int, default=4, help="drafts a round (c)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    if args.rows < 1 or args.n < 2 * (args.drafts + 1) or args.threads < 1 or args.drafts < 1:
        ap.error("need --rows >= 1, --drafts >= 1, -n >= 2 (drafts + 1), -t >= 1")
    for path in args.models:
        if not path.is_file():
            print(f"after_decode.py: error: no such model file: {path}", file=sys.stderr)
            return 1
    print(f"host filters: {'C' if native() is not None else 'numpy'}; {args.threads} threads")
    for path in args.models:
        with load(path, None, n_ctx=4096, n_threads=args.threads) as spec:
            print(f"\n{path.name} (vocabulary {spec.target.n_vocab:,})")
            print(f"  {'step':36s} {'after a decode':>15s} {'warm':>8s} {'ratio':>6s}")
            for name, (after, warm) in steps(spec, args.rows).items():
                print(f"  {name:36s} {after:12.1f} us {warm:5.1f} us {after / max(warm, 1e-3):6.1f}")
            for label, parts in rounds(spec, args.n).items():
                figures = ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
                print(f"  a plain round, {label}: {figures} us")
            rounds_verified = verify_rounds(spec, args.drafts, args.n)
            figures = ", ".join(f"{k} {v:.1f} us" for k, v in rounds_verified.items())
            print(f"  verify() of a same-as-plain round of {args.drafts} accepted drafts: {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
