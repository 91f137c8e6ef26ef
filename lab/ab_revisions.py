"""Two revisions of specli side by side: `specli run --json` of each, interleaved, on the same model,
prompts and settings; median tokens/s of each and the median of per-pair ratios (new / old).

    python lab/ab_revisions.py --old REV [--new REV|worktree] --target T.gguf [--draft D|ngram]
        [--temp 0,0.8] [-k auto] [--prompt NAME ... | --token-prompt NAME=IDS.json ...] [-n 256]
        [--repeat 4] [-t 2] [--no-cache | --pin-costs DIR] [--json out.json]

The old revision is checked out with `git worktree` into a temporary directory and run with the same
Python (its `specli` package first on sys.path). Each run is a new process, as a user's `specli run`
(what auto learned is not carried between runs, but for what specli.costcache keeps); rates exclude
load and prompt (GenerationStats). Each revision has its own cost cache, empty at the start (one shared
file would be overwritten by the other revision's), or none with --no-cache, or with --pin-costs DIR a
fresh copy of DIR's before every run (both sides start each run from the same measured costs); --warm
runs each side once per prompt, uncounted, first (a user's second run); --mixed cycles the prompts
within each repeat, so that what a run's cache carries was learned on another text. Pairs alternate
which revision runs first. Prompts: compare_llamacpp.py's (repetitive, copy-edit, code) and bench's
built-in ones (story, chat); --token-prompt NAME=FILE adds a prompt given as a JSON list of token ids (BOS
included), generated with `specli.api` and `specli run`'s defaults (the CLI takes text only).
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_llamacpp import PROMPTS  # noqa: E402

from specli.bench.suite import BUILTIN_PROMPTS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ALL_PROMPTS = {**PROMPTS, **{p.name: p.text for p in BUILTIN_PROMPTS if p.name not in PROMPTS}}
RUNNER = ("import sys; sys.path.insert(0, {root!r}); from specli.cli import main; sys.argv[0] = 'specli'; "
          "main()")
# A token-id prompt: the revision's specli.api with `specli run`'s defaults; prints what `run --json` does.
TOKEN_RUNNER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from specli.api import load
from specli.engine import GenerationParams
from specli.settings import RunSettings
target, draft, ids, n, temp, seed, threads, ctx, k = json.loads(sys.argv[2])
settings = RunSettings(max_tokens=n, temp=temp, seed=seed, ignore_eos=True, threads=threads, ctx=ctx,
                       draft_max=int(k) if k.isdigit() else k)
with load(target, None if draft == "none" else draft, n_ctx=ctx, n_threads=threads) as spec:
    # Revisions before #52 built the parameters in settings (RunSettings.generation_params).
    of = getattr(GenerationParams, "of", None)
    generation = spec.generate(ids, of(settings) if of else settings.generation_params())
    generation.complete()
    print(json.dumps({"stats": generation.stats.as_dict()}))
"""


def checkout(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(where), rev],
                   check=True, capture_output=True)
    return where


def run_once(root: Path, args: list[str], env: dict[str, str]) -> dict:
    """`specli run ARGS --json` of the revision at root, or (args: ["--tokens", JSON]) TOKEN_RUNNER."""
    # From an empty directory: a models.toml here may hold keys the other revision does not know.
    command = ([sys.executable, "-c", TOKEN_RUNNER, str(root), args[1]] if args[0] == "--tokens"
               else [sys.executable, "-c", RUNNER.format(root=str(root)), "run", *args, "--json"])
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tempfile.gettempdir(),
                          env={**os.environ, **env})
    if proc.returncode != 0:
        raise SystemExit(f"{root}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="git revision of the baseline")
    ap.add_argument("--new", default=str(REPO), help="a git revision or a directory (default: this tree)")
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", default="ngram")
    ap.add_argument("--temp", default="0,0.8")
    ap.add_argument("-k", default="auto")
    ap.add_argument("--prompt", action="append", choices=sorted(ALL_PROMPTS))
    ap.add_argument("--token-prompt", action="append", default=[], metavar="NAME=FILE",
                    help="a prompt as a JSON list of token ids")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    cache = ap.add_mutually_exclusive_group()
    cache.add_argument("--no-cache", action="store_true", help="no cost cache on either side")
    cache.add_argument("--pin-costs", metavar="DIR",
                       help="start every run from this cache directory's cost files (a copy each time)")
    ap.add_argument("--warm", action="store_true", help="one uncounted run per side and prompt first")
    ap.add_argument("--mixed", action="store_true", help="cycle the prompts within each repeat")
    ap.add_argument("--json", dest="json_path")
    opts = ap.parse_args()

    if opts.pin_costs and not (Path(opts.pin_costs) / "costs").is_dir():
        raise SystemExit(f"--pin-costs {opts.pin_costs}: want a cache directory with a costs/ folder "
                         "(the SPECLI_CACHE_DIR of earlier runs, e.g. ~/.cache/specli)")
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"old": checkout(opts.old, Path(tmp) / "old")}
        new = Path(opts.new)
        roots["new"] = new if new.is_dir() else checkout(opts.new, Path(tmp) / "new")
        envs = {side: {"SPECLI_COST_CACHE": "0"} if opts.no_cache
                else {"SPECLI_CACHE_DIR": str(Path(tmp) / f"cache-{side}"), "SPECLI_COST_CACHE": "1"}
                for side in roots}
        try:
            rows = measure(opts, roots, envs)
        finally:
            for root in roots.values():
                if root != new:
                    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(root)],
                                   capture_output=True)
    if opts.json_path:
        Path(opts.json_path).write_text(json.dumps(rows, indent=2))


def pin_costs(source: Path, cache: Path) -> None:
    """Make `cache` a fresh copy of `source`: every run starts from the same costs, where a cache each
    run rewrites is a random effect of its own (the 150k pair's draft-model auto / k=3 read 0.83 and
    0.92 fifteen minutes apart with it, 0.932 and 0.929 pinned)."""
    shutil.rmtree(cache, ignore_errors=True)
    shutil.copytree(source, cache)


def measure(opts: argparse.Namespace, roots: dict[str, Path], envs: dict[str, dict[str, str]]) -> list[dict]:
    tokens = {}
    for spec in opts.token_prompt:
        name, _, file = spec.partition("=")
        if not name or not file:
            raise SystemExit(f"--token-prompt wants NAME=FILE, got {spec!r}")
        tokens[name] = [int(t) for t in json.loads(Path(file).read_text())]
    prompts = [*(opts.prompt or ([] if tokens else ["repetitive", "copy-edit", "code", "story"])), *tokens]
    draft = ["--no-draft"] if opts.draft == "none" else ["--draft", opts.draft]
    rows = []
    print(f"{'prompt':<11} {'T':>4} {'k':>5}  {'old tok/s':>9} {'new tok/s':>9}  {'new/old':>7}  "
          f"{'old acc':>7} {'new acc':>7}", flush=True)

    def args_for(temp: float, name: str, seed: int) -> list[str]:
        if name in tokens:
            return ["--tokens", json.dumps([opts.target, opts.draft, tokens[name], opts.n, temp, seed,
                                            opts.threads, opts.ctx, opts.k])]
        return ["--target", opts.target, *draft, "-k", opts.k, "--temp", str(temp), "-n", str(opts.n),
                "--ignore-eos", "-s", str(seed), "-t", str(opts.threads), "-c", str(opts.ctx),
                ALL_PROMPTS[name]]

    pair = 0
    for temp in (float(t) for t in opts.temp.split(",")):
        # Each cell: rates and acceptance of each side, and the per-pair ratios.
        cells = {name: {"old": [], "new": [], "old_acc": [], "new_acc": [], "ratios": []} for name in prompts}
        if opts.warm:
            for name in prompts:
                for side in roots:
                    run_once(roots[side], args_for(temp, name, 999), envs[side])
        # --mixed: each repeat runs every prompt in turn, so each run follows another prompt's (as a
        # user's runs of different texts: what the cache carries comes from another text); otherwise
        # a prompt's repeats run back to back.
        schedule = ([(rep, name) for rep in range(opts.repeat) for name in prompts] if opts.mixed
                    else [(rep, name) for name in prompts for rep in range(opts.repeat)])
        for rep, name in schedule:
            cell = cells[name]
            order = ("old", "new") if pair % 2 == 0 else ("new", "old")
            pair += 1
            got = {}
            for side in order:
                if opts.pin_costs:
                    pin_costs(Path(opts.pin_costs), Path(envs[side]["SPECLI_CACHE_DIR"]))
                stats = run_once(roots[side], args_for(temp, name, 1000 + rep), envs[side])["stats"]
                got[side] = stats["tokens_per_second"]
                cell[side].append(got[side])
                cell[f"{side}_acc"].append(stats.get("acceptance_rate") or 0.0)
            cell["ratios"].append(got["new"] / got["old"])
        for name in prompts:
            cell = cells[name]
            row = {"prompt": name, "temp": temp, "k": opts.k, "draft": opts.draft,
                   "old": statistics.median(cell["old"]), "new": statistics.median(cell["new"]),
                   "ratio": statistics.median(cell["ratios"]), "ratios": cell["ratios"],
                   "old_acceptance": statistics.median(cell["old_acc"]),
                   "new_acceptance": statistics.median(cell["new_acc"])}
            rows.append(row)
            print(f"{name:<11} {temp:>4g} {opts.k:>5}  {row['old']:>9.1f} {row['new']:>9.1f}  "
                  f"{row['ratio']:>7.3f}  {row['old_acceptance']:>7.2f} {row['new_acceptance']:>7.2f}",
                  flush=True)
    print(f"median of per-pair ratios over all cells: "
          f"{statistics.median(r for row in rows for r in row['ratios']):.3f}")
    return rows

if __name__ == "__main__":
    main()
