"""-k auto with a trained head that does not pay against the target alone (#48: >= 0.97x plain).

    python -m specli_synth trained-drafters TD --size bench
    python lab/head_auto_check.py TD --heads eagle3-random dflash-random dspark-random --repeat 3
    python lab/head_auto_check.py TD --generations 1 --temp 0.8 --keep-cache --repeat 5   # one-shot runs
    python lab/head_auto_check.py G4 --target gemma4-target.gguf --heads gemma4-assistant-random

Each process loads TD/target.gguf alone (`plain`) or with one head and runs `--generations` generations
of `-n` tokens over one prompt (T `--temp` with the commands' default filters, top-k 40, top-p 0.95,
min-p 0.05; seeds 0..; with more than one, the first generation is dropped: it measures the costs and
finds that drafting does not pay); its figure is the median tok/s of the others (prompt excluded) and
the median prompt seconds; with a head, whether it rested at the end of each generation, what its
features add to a plain token (timed at load: Drafter.watch_costs; None where the target's token is
too dear to time them) and its catch-up per position, as -k auto weighs them (policy.WATCH_SHARE).
Processes run in turns, in an order that rotates each repeat, each with an
empty SPECLI_CACHE_DIR of its own (with --keep-cache, one per configuration kept across the repeats, as
a user's later runs find it); a ratio is the median of the per-repeat ratios to `plain`. `uptime`'s
load is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench_common import GPU_LAYERS  # noqa: E402
from compare_llamacpp import PLAIN_PROMPT, PROMPTS  # noqa: E402

PROMPT_CHOICES = {"short": PLAIN_PROMPT, **PROMPTS}


def child(target: str, head: str | None, prompt: str, tokens: int, generations: int, threads: int,
          temperature: float) -> None:
    from dataclasses import replace

    if os.environ.get("HEAD_AUTO_REST") == "1":
        # --rest: a declined source rests at once (as one whose catch-up is dear to watch), so the
        # target stops handing out its features; the experiment, not specli's policy
        from specli.policy import AutoK

        AutoK._dear_to_watch = lambda self, source, inputs: self._unread.get(source, 0) > 0

    from specli import GenerationParams, load
    from specli.sampling import DEFAULT_SAMPLING

    with load(target, head, n_ctx=4096, n_threads=threads, n_gpu_layers=GPU_LAYERS) as spec:
        ids = spec.tokenize(PROMPT_CHOICES[prompt])
        rates, prompts, drafted, rested = [], [], [], []
        features = getattr(spec.drafter, "features", None)
        for seed in range(generations):
            spec.engine.reset()
            sampling = replace(DEFAULT_SAMPLING, temperature=temperature)  # the commands' filters
            params = GenerationParams(max_tokens=tokens, sampling=sampling, draft_max="auto", ignore_eos=True,
                                      seed=seed)
            stats = spec.generate(ids, params).complete().stats
            rates.append(stats.n_generated / stats.generation_seconds)
            prompts.append(stats.prompt_seconds)
            drafted.append(stats.drafted)
            rested.append(int(features is not None and features.paused))  # at the end of the generation
        costs, source = spec.engine.costs, spec.drafter.sources[0].name if spec.drafter else ""
        watch, catch_up = costs.watch_seconds_per_token(source), costs.catch_up_seconds_per_position(source)
    later = slice(1 if generations > 1 else 0, None)
    print(json.dumps({"rate": statistics.median(rates[later]), "prompt": statistics.median(prompts[later]),
                      "first_rate": rates[0], "drafted": drafted, "prompt_tokens": len(ids), "rested": rested,
                      "features_us": None if watch is None else round(1e6 * watch, 1),
                      "catch_up_us": None if catch_up is None else round(1e6 * catch_up, 1)}))


def run(args: argparse.Namespace, head: str | None, prompt: str) -> dict:
    with tempfile.TemporaryDirectory() as fresh:
        cache = str(args.caches / (head or "plain")) if args.keep_cache else fresh
        env = dict(os.environ, SPECLI_CACHE_DIR=cache, HEAD_AUTO_REST="1" if args.rest else "0")
        command = [sys.executable, __file__, "--child", str(args.dir / args.target),
                   str(args.dir / f"{head}.gguf") if head else "-", prompt, str(args.n),
                   str(args.generations), str(args.threads), str(args.temp)]
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        target, head, prompt, tokens, generations, threads, temperature = sys.argv[2:9]
        child(target, None if head == "-" else head, prompt, int(tokens), int(generations), int(threads),
              float(temperature))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="a folder from `python -m specli_synth trained-drafters`")
    parser.add_argument("--heads", nargs="+", default=["eagle3-random", "dflash-random", "dspark-random"])
    parser.add_argument("--target", default="target.gguf",
                        help="the target's file in DIR (`python -m specli_synth gemma4`: gemma4-target.gguf)")
    parser.add_argument("--prompts", nargs="+", default=["short", "code"], choices=sorted(PROMPT_CHOICES))
    parser.add_argument("-n", type=int, default=256)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--keep-cache", action="store_true", help="one cost cache per configuration")
    parser.add_argument("--rest", action="store_true",
                        help="an experiment: a declined head rests at once (its features off)")
    args = parser.parse_args()
    args.caches = Path(tempfile.mkdtemp(prefix="head-auto-"))
    print("load at start:", os.getloadavg())
    configs = [None, *args.heads]
    for prompt in args.prompts:
        results: dict[str | None, list[dict]] = {c: [] for c in configs}
        for r in range(args.repeat):
            order = configs[r % len(configs):] + configs[: r % len(configs)]
            for config in order:
                results[config].append(run(args, config, prompt))
        plain = results[None]
        for config in configs:
            rows = results[config]
            pairs = list(zip(rows, plain, strict=True))
            ratio = statistics.median(row["rate"] / base["rate"] for row, base in pairs)
            first = statistics.median(row["first_rate"] / base["first_rate"] for row, base in pairs)
            print(f"{prompt} ({rows[0]['prompt_tokens']} tokens) {config or 'plain':16s} "
                  f"tok/s {[round(row['rate'], 1) for row in rows]} x plain {ratio:.3f} "
                  f"prompt s {statistics.median(row['prompt'] for row in rows):.3f} "
                  f"first generation x plain {first:.3f} "
                  f"drafted {[row['drafted'] for row in rows]} rested {[row['rested'] for row in rows]} "
                  f"features us {[row['features_us'] for row in rows]} "
                  f"catch-up us/position {[row['catch_up_us'] for row in rows]}", flush=True)
    print("load at end:", os.getloadavg())


if __name__ == "__main__":
    main()
