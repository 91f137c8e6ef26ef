"""``python -m specli_synth COMMAND``: write synthetic model sets from the command line.

    python -m specli_synth trained-drafters DIR [--size tiny|bench] [--seed N] [--kinds eagle3,dflash,...]
    python -m specli_synth gemma4 DIR [--size tiny|bench] [--seed N] [--dtype f32|q8_0]
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specli_synth", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    trained = commands.add_parser(
        "trained-drafters", help="a Qwen3-shaped target with EAGLE-3, DFlash, DSpark and DFlash2 drafters")
    trained.add_argument("directory")
    trained.add_argument("--size", choices=("tiny", "bench"), default="tiny",
                         help="tiny: the tests' set (~1 s); bench: a 152k-vocabulary Q8_0 set for speed")
    trained.add_argument("--seed", type=int, default=0)
    trained.add_argument("--kinds", default="eagle3,dflash,dspark,dflash2",
                         help="the drafters to write, comma-separated (default: all four)")
    gemma4 = commands.add_parser(
        "gemma4", help="a Gemma 4 target with its Gemma 4 assistant (structured and random)")
    gemma4.add_argument("directory")
    gemma4.add_argument("--size", choices=("tiny", "bench"), default="tiny",
                        help="tiny: the tests' set (~0.2 s); bench: Gemma's 262k vocabulary, Q8_0 (~12 s)")
    gemma4.add_argument("--seed", type=int, default=0)
    gemma4.add_argument("--dtype", choices=("f32", "q8_0"), default=None,
                        help="the matrices' (default: F32 for tiny, Q8_0 for bench)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    if args.command == "gemma4":
        from specli_synth.gemma4 import write_gemma4_set

        files = write_gemma4_set(args.directory, size=args.size, seed=args.seed, dtype=args.dtype)
    else:
        from specli_synth.trained_drafters import write_trained_drafters

        kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
        try:
            files = write_trained_drafters(args.directory, size=args.size, seed=args.seed, kinds=kinds)
        except ValueError as e:
            parser.error(str(e))
    for name, path in vars(files).items():
        if path is not None:
            print(f"{name:16} {path}")
    print(f"written in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
