"""What a trained head's features cost the target's own decode (issue #48 on a GPU).

    python lab/feature_tax.py TD/target.gguf TD/eagle3-random.gguf [TD/dflash-random.gguf ...]
                              [-n 128] [--repeat 5] [-t 2]

On an H200 (2026-11-28, lab/runs/2026-11-28-h200.txt) a random head that -k auto never drafted with
ran at 0.78-0.87x of the target alone. A declined head that does not rest keeps llama.cpp handing out
the target's layer inputs at every decode (heads.TargetFeatures), which nothing in -k auto prices. This
times the target's one-token decode (Model.decode, the head loaded) with the features on, as a
declined head leaves them, and off, as a resting head does (TargetFeatures.pause), in blocks of n
decodes from the same position, alternating which goes first, in one process (medians over --repeat
blocks). The whole round, proposer and shadows included, is lab/head_auto_check.py's (--rest: what a
declined head costs when it rests at once). Offloads SPECLI_LAB_GPU_LAYERS layers (lab/device_check.sh
sets it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import GPU_LAYERS  # noqa: E402
from compare_llamacpp import PLAIN_PROMPT  # noqa: E402

from specli import load  # noqa: E402


def decode_block(target, token: int, keep: int, n: int) -> float:
    """Seconds per token of n one-token decodes after `keep` cached positions (rolled back after)."""
    started = time.perf_counter()
    for _ in range(n):
        target.decode([token], outputs="last")
    seconds = (time.perf_counter() - started) / n
    target.truncate(keep)
    return seconds


def measure(target: Path, head: Path, args: argparse.Namespace) -> None:
    with load(target, head, n_ctx=2048, n_threads=args.threads, n_gpu_layers=GPU_LAYERS) as spec:
        engine = spec.engine
        model, features = engine.target, engine.drafter.features
        prompt = spec.tokenize(PLAIN_PROMPT)
        model.reset()
        model.decode(prompt, outputs="last")
        keep = model.n_past
        token = prompt[-1]
        on, off = [], []
        for state in (True, False):  # warm both graphs
            (features.resume if state else features.pause)()
            decode_block(model, token, keep, 8)
        for rep in range(args.repeat):
            for state in ((True, False) if rep % 2 == 0 else (False, True)):
                (features.resume if state else features.pause)()
                (on if state else off).append(decode_block(model, token, keep, args.n))
        features.resume()
        at_load = engine.costs.watch_seconds_per_token(engine.drafter.sources[0].name)
    t_on, t_off = 1000 * statistics.median(on), 1000 * statistics.median(off)
    # What the drafter timed at load (TargetFeatures.tax, which -k auto weighs; None where a token costs
    # more than heads.TAX_TIMED_TOKEN), beside these longer blocks.
    load_text = "not timed" if at_load is None else f"{1000 * at_load:+.3f} ms"
    print(f"{head.name}: one-token decode {t_on:.3f} ms with the features, {t_off:.3f} without: "
          f"{t_on - t_off:+.3f} ms ({100 * (t_on / t_off - 1):+.1f} %); at load: {load_text}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("heads", type=Path, nargs="+")
    ap.add_argument("-n", type=int, default=128, help="decodes (tokens) per block")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    for head in args.heads:
        measure(args.target, head, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
