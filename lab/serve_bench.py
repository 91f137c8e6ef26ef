"""What `specli serve` costs over `specli run`: streamed tokens/s, time to first token, and the prompt tokens
a chat turn evaluates.

    python lab/serve_bench.py [--configs gemma-ngram,demo-pair] [-n 256] [--repeat 5] [-t 0]

For each configuration (Gemma 3 270M Q4_K_M with --draft ngram; the demo pair, target + draft model,
built into ./demo-models if absent) one `specli serve` runs on 127.0.0.1 and, interleaved with it
(run, serve, serve, run, ...: machine drift hits both sides alike), `specli run --json` generates the
same tokens (same prompt, seed, temperature 0, -n tokens with EOS ignored, same threads and context).
Per pair it records:
  run tok/s        `specli run`'s own figure (first round to last token)
  server tok/s     the server's `timings.predicted_per_second` (the same definition, in the server)
  streamed tok/s   at the client: tokens received after the first batch / time from it to the last
  TTFT             at the client: request sent to first text received (prompt cached or not: both)
and the medians of each and of the per-pair ratios. On a shared machine wall-clock rates swing by tens of
percent from one minute to the next, so --cpu also measures what that noise does not touch: CPU seconds
per generated token (use -t 1: no spinning worker threads), the server process's (its event loop and
streaming included) against `specli run`'s, each less the same request for 1 token (load, prompt).
Then a 5-turn chat through /v1/chat/completions
(Gemma's chat template): per turn the prompt's tokens, how many were evaluated (`timings.prompt_n`)
and how many the turn added (its prompt minus the previous prompt and reply).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import GEMMA_HINT, gemma_path  # noqa: E402

from specli.bench.suite import BUILTIN_PROMPTS  # noqa: E402

EXE = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
PROMPTS = {p.name: p.text for p in BUILTIN_PROMPTS}
CHAT_TURNS = [
    "Write a Python function that checks whether a number is prime.",
    "Now make it faster for large numbers.",
    "Add a docstring and type hints.",
    "Write three unit tests for it.",
    "Summarise what the function does in one sentence.",
]


@dataclass
class Config:
    name: str
    target: Path
    draft: str
    prompt: str


@dataclass
class Pair:
    run_rate: float
    server_rate: float
    streamed_rate: float
    ttft: float
    same_text: bool


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log: list[str] = field(default_factory=list)

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(60)


def start_server(config: Config, args: argparse.Namespace) -> Server:
    proc = subprocess.Popen(
        [EXE, "serve", "--target", str(config.target), "--draft", config.draft, "--host", "127.0.0.1",
         "--port", "0", "-t", str(args.threads), "-c", str(args.ctx), "-k", args.k],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = None
    deadline = time.monotonic() + 300
    assert proc.stderr is not None
    for line in proc.stderr:  # bounded by the server: it prints "ready" or exits
        if m := re.search(r"listening on (http://\S+)", line):
            url = m.group(1)
        if "ready:" in line or time.monotonic() > deadline:
            break
    if url is None or proc.poll() is not None:
        proc.kill()
        raise SystemExit(f"the server did not start ({config.name})")
    # Keep reading its log so that its pipe never fills.
    server = Server(proc, url)
    threading.Thread(target=lambda: server.log.extend(proc.stderr), daemon=True).start()
    return server


def run_once(config: Config, args: argparse.Namespace, seed: int,
             max_tokens: int | None = None) -> tuple[float, str]:
    out = subprocess.run(
        [EXE, "run", "--target", str(config.target), "--draft", config.draft, "-n", str(max_tokens or args.n),
         "--temp", "0", "-s", str(seed), "--ignore-eos", "-t", str(args.threads), "-c", str(args.ctx),
         "-k", args.k, "--json", config.prompt],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    if out.returncode:
        raise SystemExit(out.stderr)
    result = json.loads(out.stdout)
    return result["stats"]["tokens_per_second"], result["text"]


def serve_once(server: Server, config: Config, args: argparse.Namespace, seed: int,
               prompt: str | None = None, max_tokens: int | None = None) -> tuple[float, float, float, str]:
    """(server tok/s, streamed tok/s at the client, time to first text, text) of one streamed completion."""
    body = {"model": "m", "prompt": prompt or config.prompt, "max_tokens": max_tokens or args.n,
            "temperature": 0, "seed": seed, "ignore_eos": True, "stream": True}
    parts: list[str] = []
    arrivals: list[tuple[float, int]] = []  # (time, tokens so far) at each read with text
    timings = None
    with httpx.Client(timeout=600) as http:
        sent = time.perf_counter()
        with http.stream("POST", server.url + "/v1/completions", json=body) as response:
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    parts.append(chunk["choices"][0]["text"])
                    arrivals.append((now, len(parts)))
                timings = chunk.get("timings", timings)
    assert timings is not None and arrivals
    # Tokens that arrive together (a round's) are read together: rate from the first arrival on.
    first_time, first_count = arrivals[0]
    first_batch = max(count for t, count in arrivals if t - first_time < 1e-4)
    last_time = arrivals[-1][0]
    n_after = timings["predicted_n"] - first_batch
    streamed = n_after / (last_time - first_time) if last_time > first_time else float("nan")
    return timings["predicted_per_second"], streamed, first_time - sent, "".join(parts)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (Linux)."""
    return process_cpu_seconds_of(Path(f"/proc/{pid}/stat"))


def process_cpu_seconds_of(stat: Path) -> float:
    """User + system CPU seconds from a /proc stat file (a process's, or a thread's under task/)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def thread_split(config: Config, args: argparse.Namespace, server: Server) -> None:
    """CPU seconds of each of the server's threads over one streamed request: the event loop's (HTTP,
    JSON, server-sent events) against the generation thread's."""

    def per_thread() -> dict[str, tuple[str, float]]:
        out = {}
        for task in Path(f"/proc/{server.proc.pid}/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
                out[task.name] = (name, process_cpu_seconds_of(task / "stat"))
            except OSError:  # the thread ended meanwhile
                pass
        return out

    before = per_thread()
    serve_once(server, config, args, 100)
    after = per_thread()
    spent = {f"{name} ({tid})": cpu - before.get(tid, (name, 0.0))[1] for tid, (name, cpu) in after.items()}
    print("  CPU per thread over one request: " + ", ".join(
        f"{k} {v:.2f} s" for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v > 0))


def cpu_per_token(config: Config, args: argparse.Namespace, server: Server) -> None:
    """CPU seconds per token: (CPU of an n-token generation - CPU of a 1-token one) / (n - 1), for the
    server (its process, while it serves the request) and for `specli run` (the child's whole life)."""
    n = args.n

    def served(tokens: int) -> float:
        before = process_cpu_seconds(server.proc.pid)
        serve_once(server, config, args, 100, max_tokens=tokens)
        return process_cpu_seconds(server.proc.pid) - before

    def ran(tokens: int) -> float:
        before = children_cpu_seconds()
        run_once(config, args, 100, max_tokens=tokens)
        return children_cpu_seconds() - before

    server_costs, run_costs = [], []
    for r in range(args.repeat):
        order = [("serve", served), ("run", ran)] if r % 2 else [("run", ran), ("serve", served)]
        for name, measure in order:
            per_token = (measure(n) - measure(1)) / (n - 1)
            (server_costs if name == "serve" else run_costs).append(per_token)
    med = statistics.median
    ratios = sorted(a / b for a, b in zip(server_costs, run_costs, strict=True))
    listed = " ".join(f"{x:.3f}" for x in ratios)
    print(f"  CPU per token (median of {args.repeat}): server {1000 * med(server_costs):.2f} ms · run "
          f"{1000 * med(run_costs):.2f} ms · ratio server/run {med(ratios):.3f} (pairs, sorted: {listed}): "
          f"where the CPU is the limit, the server runs at {1 / med(ratios):.3f}x run's rate")


def bench_config(config: Config, args: argparse.Namespace) -> None:
    print(f"\n== {config.name}: {config.target.name} + {config.draft}, -n {args.n}, -k {args.k}, temp 0, "
          f"-t {args.threads}, {args.repeat} interleaved pairs", flush=True)
    server = start_server(config, args)
    try:
        serve_once(server, config, args, 0)  # warm-up: the first generation pays for cold caches
        if args.cpu:
            thread_split(config, args, server)
            cpu_per_token(config, args, server)
            if args.cpu_only:
                return
        run_once(config, args, 0)
        pairs: list[Pair] = []
        for r in range(args.repeat):
            seed = 100 + r
            if r % 2 == 0:
                run_rate, run_text = run_once(config, args, seed)
                server_rate, streamed, ttft, text = serve_once(server, config, args, seed)
            else:
                server_rate, streamed, ttft, text = serve_once(server, config, args, seed)
                run_rate, run_text = run_once(config, args, seed)
            pairs.append(Pair(run_rate, server_rate, streamed, ttft, text == run_text))
            print(f"  pair {r + 1}: run {run_rate:7.1f} tok/s · server {server_rate:7.1f} · streamed "
                  f"{streamed:7.1f} · TTFT {1000 * ttft:6.1f} ms (prompt cached) · same text: "
                  f"{text == run_text}", flush=True)
        cold = []
        for _ in range(args.repeat):  # a prompt the cache has not seen: TTFT includes its evaluation
            fresh = f"[{time.time_ns()}] " + config.prompt
            cold.append(serve_once(server, config, args, 7, prompt=fresh, max_tokens=8)[2])
        med = statistics.median
        print(f"  median: run {med(p.run_rate for p in pairs):.1f} tok/s · server "
              f"{med(p.server_rate for p in pairs):.1f} · streamed {med(p.streamed_rate for p in pairs):.1f}")
        ratios = sorted(p.server_rate / p.run_rate for p in pairs)
        listed = " ".join(f"{r:.2f}" for r in ratios)
        print(f"  median ratio server/run {med(ratios):.3f} (pairs, sorted: {listed}) · "
              f"streamed/run {med(p.streamed_rate / p.run_rate for p in pairs):.3f} · same text "
              f"{sum(p.same_text for p in pairs)}/{len(pairs)}")
        print(f"  TTFT median: {1000 * med(p.ttft for p in pairs):.1f} ms with the prompt cached, "
              f"{1000 * med(cold):.1f} ms evaluating it ({len(config.prompt)} characters)")
    finally:
        server.stop()


def chat_turns(target: Path, args: argparse.Namespace) -> None:
    """Five turns; per turn, what the prompt holds, what the server evaluated, and what the new turn's
    rendering adds to the conversation (its user message and the template's framing around it)."""
    from specli import load
    from specli.chat.prompt import ChatFormat

    print(f"\n== 5-turn chat through /v1/chat/completions: {target.name} + ngram, 96 tokens per reply, "
          "temp 0")
    with load(target, n_ctx=64, n_threads=1) as spec:  # the tokenizer and chat format, as the server's
        chat = ChatFormat.for_model(spec.target)

        def turn_tokens(messages: list[dict]) -> int:
            before = chat.tokenize(chat.template.render(messages[:-1], add_generation_prompt=False))
            return len(chat.tokenize(chat.render(messages))) - (len(before) if messages[:-1] else 0)

        server = start_server(Config("chat", target, "ngram", ""), args)
        try:
            messages: list[dict] = []
            with httpx.Client(timeout=600) as http:
                for i, text in enumerate(CHAT_TURNS, 1):
                    messages.append({"role": "user", "content": text})
                    reply = http.post(server.url + "/v1/chat/completions", json={
                        "model": "m", "messages": messages, "max_tokens": 96, "temperature": 0,
                        "seed": i}).json()
                    usage, timings = reply["usage"], reply["timings"]
                    print(f"  turn {i}: prompt {usage['prompt_tokens']:4d} tokens · evaluated "
                          f"{timings['prompt_n']:4d} · from the cache {timings['cache_n']:4d} · the new turn "
                          f"{turn_tokens(messages):3d} tokens · reply {usage['completion_tokens']} tokens "
                          f"({reply['speculation']['stop_reason']})", flush=True)
                    answer = reply["choices"][0]["message"]["content"]
                    messages.append({"role": "assistant", "content": answer})
        finally:
            server.stop()


def demo_pair() -> tuple[Path, Path]:
    from specli_synth.demo import DEMO_DRAFT_FILE, DEMO_TARGET_FILE, build_demo_pair

    directory = Path(os.environ.get("SPECLI_DEMO_DIR", "demo-models"))
    target, draft = directory / DEMO_TARGET_FILE, directory / DEMO_DRAFT_FILE
    if not (target.is_file() and draft.is_file()):
        print(f"building the demo pair into {directory} (about 30 s, once)", flush=True)
        directory.mkdir(parents=True, exist_ok=True)
        target, draft = build_demo_pair(directory)
    return target, draft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="gemma-ngram,demo-pair,chat")
    parser.add_argument("-n", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("-t", "--threads", type=int, default=0)
    parser.add_argument("-c", "--ctx", type=int, default=4096)
    parser.add_argument("-k", default="auto", help="both sides' -k (auto: the server's learns as it goes)")
    parser.add_argument("--cpu", action="store_true", help="also CPU seconds per token (Linux)")
    parser.add_argument("--cpu-only", action="store_true", help="only CPU seconds per token")
    args = parser.parse_args()
    args.cpu = args.cpu or args.cpu_only
    wanted = args.configs.split(",")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    gemma = gemma_path()
    with tempfile.TemporaryDirectory() as home:
        os.environ.update(HOME=home, XDG_CONFIG_HOME=home)  # no models.toml of the user's
        os.environ.pop("SPECLI_CONFIG", None)
        if "gemma-ngram" in wanted:
            if gemma is None:
                print(GEMMA_HINT)
            else:
                config = Config("Gemma 3 270M, n-gram lookup", gemma, "ngram", PROMPTS["copy-edit"])
                bench_config(config, args)
        if "demo-pair" in wanted:
            target, draft = demo_pair()
            bench_config(Config("demo pair, draft model", target, str(draft), PROMPTS["code"]), args)
        if "chat" in wanted and gemma is not None:
            chat_turns(gemma, args)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
