"""specli (local, in-process) against llama-server with the same pair and settings, single client.

For each setup, starts llama-server with exactly the flags `specli export --to llama-server` prints (the
llama-server that lab/build_llama_tools.sh --with-server builds from the llama.cpp specli runs on),
on 127.0.0.1 and a free port, then runs `specli bench --server`: every local plain/speculative pair is
followed by the same request (prompt, seed, temperature, -n) to the server, so drift hits all three
alike. Prints one markdown table of medians from the bench's JSON.

    python lab/server_compare.py [--setups ngram,draft] [-k 4] [--temps 0,0.8] [-n 128] [--repeat 3]

Setups: `ngram`: Gemma 3 270M Q4_K_M with n-gram lookup (the `gemma` extra); `draft`: the demo pair
(`specli demo-models DIR`, --demo-dir). Needs llama-server (skips a setup whose models are missing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import find_tool, gemma_path, stop_process, wait_healthy  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def specli(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
    return subprocess.run([exe, *args], capture_output=True, text=True, check=True)


def run_setup(name: str, pair: list[str], args: argparse.Namespace, server_bin: Path, work: Path) -> dict:
    port = free_port()
    common = ["-k", str(args.k), "-t", str(args.threads), "-c", str(args.ctx)]
    exported = json.loads(specli("export", "--to", "llama-server", "--json", *pair, *common,
                                 "--port", str(port)).stdout)
    env = exported.get("env", {})  # batch-invariant arithmetic: GGML_CPU_TILED_MM=0, as export prints
    print(f"# {name}: {' '.join(f'{k}={v}' for k, v in env.items())} {' '.join(exported['argv'])}",
          file=sys.stderr)
    log = (work / f"{name}-server.log").open("wb")
    proc = subprocess.Popen([str(server_bin), *exported["argv"][1:]], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        out = work / f"{name}.json"
        specli("bench", *pair, *common, "--temp", args.temps, "-n", str(args.n), "--repeat", str(args.repeat),
               "--server", f"llama-server={url}", "--json", str(out))
        return json.loads(out.read_text())
    finally:
        stop_process(proc, 30)
        log.close()


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None else f"{x:{spec}}"


def table(rows: list[tuple[str, dict]]) -> str:
    lines = ["| setup | T | specli plain tok/s | specli speculative tok/s (× plain) | specli acceptance | "
             "llama-server tok/s, client (× plain) | llama-server tok/s, its timings | "
             "llama-server acceptance | llama-server first token |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, doc in rows:
        local = {(c["temperature"], c["k"]): c for c in doc["configs"]}
        for s in doc["server_configs"]:
            c = local[(s["temperature"], s["k"])]
            acc = s["acceptance_rate"]
            ttft = s["ttft_seconds"]["median"]
            lines.append(
                f"| {name} | {s['temperature']:g} | {fmt(c['plain_tps']['median'])} | "
                f"{fmt(c['spec_tps']['median'])} ({fmt(c['speedup']['median'], '.2f')}×) | "
                f"{fmt(None if c['acceptance_rate'] is None else 100 * c['acceptance_rate'], '.0f')} % | "
                f"{fmt(s['tokens_per_second']['median'])} ({fmt(s['vs_plain']['median'], '.2f')}×) | "
                f"{fmt(s['server_tokens_per_second']['median'])} | "
                f"{fmt(None if acc is None else 100 * acc, '.0f')} % | "
                f"{fmt(None if ttft is None else 1000 * ttft, '.0f')} ms |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--setups", default="ngram,draft")
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--temps", default="0,0.8")
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--demo-dir", type=Path, default=Path("demo-models"))
    args = parser.parse_args()
    server_bin = find_tool("llama-server")
    if server_bin is None:
        raise SystemExit("llama-server not found: bash lab/build_llama_tools.sh --with-server")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for setup in args.setups.split(","):
            if setup == "ngram":
                gemma = gemma_path()
                if gemma is None:
                    print("# skipping ngram: Gemma 3 270M not installed", file=sys.stderr)
                    continue
                pair = ["-m", str(gemma), "--draft", "ngram"]
                label = "Gemma 3 270M, n-gram"
            elif setup == "draft":
                target = args.demo_dir / "specli-demo-target.gguf"
                draft = args.demo_dir / "specli-demo-draft.gguf"
                if not (target.is_file() and draft.is_file()):
                    print(f"# skipping draft: no demo pair in {args.demo_dir}", file=sys.stderr)
                    continue
                pair = ["-m", str(target), "--draft", str(draft)]
                label = "demo pair, draft model"
            else:
                raise SystemExit(f"unknown setup {setup!r}")
            rows.append((label, run_setup(setup, pair, args, server_bin, Path(tmp))))
    print(f"k = {args.k}, -n {args.n}, {args.repeat} pairs x 4 prompts per cell, {args.threads} threads, "
          "medians")
    print(table(rows))


if __name__ == "__main__":
    main()
