"""The host work a fast token can afford (issue #51): specli against llama.cpp's own tools on stand-ins
whose tokens cost well under a millisecond here, so that what specli does outside llama_decode shows.

    python lab/host_work.py [--plain M.gguf ...] [--pair TARGET.gguf DRAFT.gguf] [--trained DIR]
                            [--gemma4 DIR] [-n 512] [--repeat 3] [-t 2] [--sampling-on auto|backend|host]
                            [--json OUT]

Build the stand-ins with `python lab/build_host_standin.py DIR` (262,144 tokens, ~0.57 ms a token
here), `python lab/build_large_vocab_pair.py DIR` (its draft, 151,936 tokens, is the 150k stand-in:
pass it as --plain, and the pair as --pair) and `python -m specli_synth trained-drafters DIR --size
bench` (a 152k-vocabulary target with EAGLE-3, DFlash and DSpark heads: --trained DIR), `python -m
specli_synth gemma4 DIR --size bench` (a 262k Gemma 4 target and its assistant: --gemma4 DIR).
llama.cpp's tools from lab/build_llama_tools.sh --with-server. Every rate excludes load and prompt on
both sides.

a) plain decoding, per --plain model, each repetition in a rotating order: `llama-bench -p 0 -n N` tg;
   specli --no-draft at T 0 and with the default sampling (top-k 40, top-p 0.95, min-p 0.05, T 0.8),
   on each sampling path of --paths (graph: llama.cpp's backend sampling, host: specli's filters), and
   with --numpy, numpy's filters instead of native_sampling.c's (what runs where no C compiler is);
   llama-server (started once per model, `-np 1`) asked for N tokens at the same sampling, its own
   timings (`predicted_per_second`: its decode loop with its sampler, no HTTP). Ratios are per
   repetition (specli over the tool of the same repetition), then the median.
b) a draft step, per drafter: specli -k K at T 0 (draft seconds over positions drafted: decodes,
   the filters and the draw) against llama-speculative-simple --spec-draft-n-max K (its `dur(g)`
   over `#gen tokens`, from its statistics line: the same work in C++). A DFlash block is one step:
   its cost per block (drafting rounds) on both sides.
c) the share of k = K rounds' wall time outside llama_decode (specli's overhead_fraction), from b)'s runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import GPU_LAYERS, find_tool, no_repack_flags, stop_process, tools_dir, wait_healthy  # noqa: E402
from compare_llamacpp import PLAIN_PROMPT, PROMPTS, ToolError, llama_bench_tg, run_tool  # noqa: E402
from host_filters import use_numpy  # noqa: E402

from specli import GenerationParams, SamplingParams, load  # noqa: E402
from specli.sampling import DEFAULT_SAMPLING  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Cell:
    """One figure over repetitions: rates (or ms), and ratios to the reference of the same repetition."""

    what: str
    values: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)

    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    def ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None


def where(path: str) -> dict[str, str]:
    """A sampling path (--sampling-on's, or --paths' "graph" for backend) as GenerationParams'
    sampling_on, named only when not auto (so that the script also times revisions without it)."""
    return {} if path == "auto" else {"sampling_on": "backend" if path == "graph" else path}


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


# -- a) plain decoding -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """llama-server with one model and one slot on 127.0.0.1 (export's environment: no tiled matmul)."""

    def __init__(self, binary: Path, model: Path, args: argparse.Namespace) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(binary), "-m", str(model), "-t", str(args.threads), "-c", str(args.ctx), "-np", "1",
               "--host", "127.0.0.1", "--port", str(self.port), *no_repack_flags("llama-server")]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     env={**os.environ, "GGML_CPU_TILED_MM": "0"})
        wait_healthy(self.proc, self.url)

    def rate(self, n: int, sampling: SamplingParams, seed: int) -> float:
        """The server's own tokens/s for n tokens (timings.predicted_per_second)."""
        body = {"prompt": PLAIN_PROMPT, "n_predict": n, "ignore_eos": True, "seed": seed,
                "cache_prompt": False, "temperature": sampling.temperature, "top_k": sampling.top_k,
                "top_p": sampling.top_p, "min_p": sampling.min_p}
        request = urllib.request.Request(self.url + "/completion", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as r:
            doc = json.load(r)
        return float(doc["timings"]["predicted_per_second"])

    def close(self) -> None:
        stop_process(self.proc, 30)


def plain(model: Path, args: argparse.Namespace) -> list[Cell]:
    """a): llama-bench, llama-server and specli's plain decoding at T 0 and the default sampling, per
    sampling path asked for (--paths), each repetition in a rotating order."""
    bench, server_bin = find_tool("llama-bench", args.tools), find_tool("llama-server", args.tools)
    paths = args.paths.split(",") if args.paths else [args.sampling_on]
    tg = Cell("llama-bench tg")
    served = Cell("llama-server default sampling")
    spec = load(model, None, n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=GPU_LAYERS)
    server = Server(server_bin, model, args) if server_bin else None
    try:
        prompt = spec.tokenize(PLAIN_PROMPT)

        def specli_rate(sampling: SamplingParams, seed: int, path: str, numpy_filters: bool = False) -> float:
            spec.engine.reset()
            params = GenerationParams(max_tokens=args.n, sampling=sampling, seed=seed, ignore_eos=True,
                                      draft_max=0, **where(path))
            use_numpy(numpy_filters)  # what a machine without a C compiler runs (specli/native.py)
            try:
                return spec.generate(prompt, params).complete().stats.tokens_per_second or 0.0
            finally:
                use_numpy(False)

        def label(what: str, path: str) -> str:
            return what if len(paths) == 1 else f"{what} [{path}]"

        runs = {"llama-bench": lambda rep: llama_bench_tg(bench, model, args.n, args.threads) if bench
                else None}
        specli_runs: list[tuple[str, str]] = []  # (run name, "T 0" or "default")
        for path in paths:
            runs[label("specli T 0", path)] = lambda rep, path=path: specli_rate(GREEDY, rep, path)
            runs[label("specli default", path)] = (lambda rep, path=path:
                                                   specli_rate(DEFAULT_SAMPLING, rep, path))
            specli_runs += [(label("specli T 0", path), "T 0"), (label("specli default", path), "default")]
        if args.numpy:
            runs["specli default, numpy"] = lambda rep: specli_rate(DEFAULT_SAMPLING, rep, paths[0], True)
            specli_runs.append(("specli default, numpy", "default"))
        runs["llama-server"] = lambda rep: server.rate(args.n, DEFAULT_SAMPLING, rep) if server else None
        versus_bench = {name: Cell(f"{name} (x llama-bench)") for name, _ in specli_runs}
        versus_server = {name: Cell(f"{name} (x llama-server)") for name, what in specli_runs
                         if what == "default"}
        for name in runs:  # warm-up: compute buffers, the server's first request
            runs[name](0)
        names = list(runs)
        for rep in range(args.repeat):
            order = names[rep % len(names):] + names[: rep % len(names)]
            got = {name: runs[name](rep) for name in order}
            for cell, value in ((tg, got["llama-bench"]), (served, got["llama-server"])):
                if value is not None:
                    cell.values.append(value)
            for name, cell in versus_bench.items():
                cell.values.append(got[name])
                if got["llama-bench"]:
                    cell.ratios.append(got[name] / got["llama-bench"])
            for name, cell in versus_server.items():
                if got["llama-server"]:
                    cell.values.append(got[name])
                    cell.ratios.append(got[name] / got["llama-server"])
            say(f"  plain {model.name} rep {rep + 1}: " + ", ".join(f"{k} {fmt(v)}" for k, v in got.items())
                + " tok/s")
    finally:
        spec.close()
        if server:
            server.close()
    return [tg, *versus_bench.values(), served, *versus_server.values()]


# -- b) and c) draft steps --------------------------------------------------------------------------

_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_STATS = re.compile(r"#calls\(b,g,a\) = +(\d+) +(\d+) +(\d+), #gen drafts = +(\d+), #acc drafts = +(\d+), "
                    r"#gen tokens = +(\d+), #acc tokens = +(\d+).*?"
                    r"dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms")


@dataclass
class ToolDraft:
    gen_drafts: int
    gen_tokens: int
    draft_ms: float  # dur(g): all the draft() calls
    rate: float


def tool_draft(target: Path, draft: Path, spec_type: str, k: int, args: argparse.Namespace) -> ToolDraft:
    tool = find_tool("llama-speculative-simple", args.tools)
    if tool is None:
        raise ToolError("no llama-speculative-simple (lab/build_llama_tools.sh)")
    cmd = [str(tool), "-m", str(target), "-md", str(draft), "--spec-type", spec_type, "-p", PROMPTS["code"],
           "-n", str(args.draft_n - 1), "-t", str(args.threads), "-c", str(args.ctx), "--temp", "0",
           "--ignore-eos", "--seed", "0", "--spec-draft-n-max", str(k), "-lv", "4",
           *no_repack_flags("llama-speculative-simple")]
    out, err = run_tool(cmd)
    text = err + "\n" + out
    stats, decoded = _STATS.search(text), _DECODED.search(text)
    if not stats or not decoded:
        raise ToolError("no statistics line (dur(b,g,a)) in llama-speculative-simple's log")
    return ToolDraft(int(stats.group(4)), int(stats.group(6)), float(stats.group(9)),
                     int(decoded.group(1)) / float(decoded.group(2)))


def drafters(args: argparse.Namespace) -> list[tuple[str, Path, Path, str, bool]]:
    """(name, target, draft, llama.cpp's --spec-type, a block drafter)."""
    out = []
    if args.pair:
        out.append(("draft model", Path(args.pair[0]), Path(args.pair[1]), "draft-simple", False))
    if args.trained:
        d = Path(args.trained)
        out.append(("EAGLE-3", d / "target.gguf", d / "eagle3.gguf", "draft-eagle3", False))
        out.append(("DFlash", d / "target.gguf", d / "dflash.gguf", "draft-dflash", True))
        out.append(("DSpark", d / "target.gguf", d / "dspark.gguf", "draft-dspark", True))
    if args.gemma4:
        d = Path(args.gemma4)
        out.append(("Gemma 4 assistant", d / "gemma4-target.gguf", d / "gemma4-assistant.gguf", "draft-mtp",
                    False))
    return out


def speculative(spec, prompt: list[int], seed: int, args: argparse.Namespace):
    """One greedy generation at k = args.k from an empty cache: its stats."""
    spec.engine.reset()
    params = GenerationParams(max_tokens=args.draft_n, sampling=GREEDY, seed=seed, ignore_eos=True,
                              draft_max=args.k, **where(args.sampling_on))
    return spec.generate(prompt, params).complete().stats


def draft_steps(args: argparse.Namespace) -> list[Cell]:
    cells = []
    for name, target, draft, spec_type, block in drafters(args):
        unit = "block" if block else "step"
        ours = Cell(f"{name}: specli ms a {unit} (x llama.cpp)")
        theirs = Cell(f"{name}: llama.cpp ms a {unit}")
        outside = Cell(f"{name}: k={args.k} rounds outside llama_decode (%)")
        rates = Cell(f"{name}: specli k={args.k} tok/s (x llama-speculative-simple)")
        spec = load(target, draft, n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=GPU_LAYERS)
        try:
            prompt = spec.tokenize(PROMPTS["code"])
            speculative(spec, prompt, 0, args)  # warm-up
            for rep in range(args.repeat):
                first_tool = rep % 2 == 0
                tool = tool_draft(target, draft, spec_type, args.k, args) if first_tool else None
                st = speculative(spec, prompt, rep, args)
                if tool is None:
                    tool = tool_draft(target, draft, spec_type, args.k, args)
                steps = st.drafting_rounds if block else st.drafted
                mine = 1000 * st.draft_seconds / max(1, steps)
                tool_steps = tool.gen_drafts if block else tool.gen_tokens
                tool_ms = tool.draft_ms / max(1, tool_steps)
                ours.values.append(mine)
                ours.ratios.append(mine / tool_ms)
                theirs.values.append(tool_ms)
                outside.values.append(100 * (st.overhead_fraction or 0.0))
                rates.values.append(st.tokens_per_second or 0.0)
                rates.ratios.append((st.tokens_per_second or 0.0) / tool.rate)
                say(f"  {name} rep {rep + 1}: specli {mine:.3f} ms a {unit} ({steps}), "
                    f"llama.cpp {tool_ms:.3f} ({tool_steps}); outside llama_decode "
                    f"{outside.values[-1]:.2f} %; "
                    f"{rates.values[-1]:.1f} vs {tool.rate:.1f} tok/s")
        finally:
            spec.close()
        cells += [theirs, ours, outside, rates]
    return cells


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plain", action="append", default=[], help="a model for a) (repeatable)")
    ap.add_argument("--pair", nargs=2, metavar=("TARGET", "DRAFT"), help="a draft-model pair for b)")
    ap.add_argument("--trained", help="a directory of `specli_synth trained-drafters` for b)")
    ap.add_argument("--gemma4", help="a directory of `specli_synth gemma4` for b): its assistant")
    ap.add_argument("-n", type=int, default=512, help="tokens a plain run generates")
    ap.add_argument("--draft-n", type=int, default=64, help="tokens a speculative run generates")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    ap.add_argument("--sampling-on", default="auto", choices=("auto", "backend", "host"))
    ap.add_argument("--paths", help="a): time specli on each of these sampling paths in the same "
                    "repetitions, e.g. graph,host (default: --sampling-on's)")
    ap.add_argument("--numpy", action="store_true",
                    help="a): also the default sampling with numpy's filters instead of native_sampling.c's")
    ap.add_argument("--tools", type=Path, default=None,
                    help="llama.cpp's binaries (default: the build cache)")
    ap.add_argument("--json", type=Path, help="write every sample here")
    args = ap.parse_args()
    args.tools = args.tools or tools_dir()
    started = time.time()
    sections: dict[str, list[Cell]] = {}
    for model in args.plain:
        say(f"a) plain decoding on {Path(model).name}")
        sections[f"plain {Path(model).name}"] = plain(Path(model), args)
    if args.pair or args.trained or args.gemma4:
        say(f"b) draft steps, k = {args.k}")
        sections["draft steps"] = draft_steps(args)
    if not sections:
        ap.error("nothing to measure: give --plain, --pair, --trained or --gemma4")
    with open("/proc/loadavg") as f:
        load_average = f.read().split()[:3]
    print(f"{args.threads} threads, -n {args.n} (speculative {args.draft_n}), {args.repeat} repetitions, "
          f"sampling on {args.sampling_on}; load average at the end {' '.join(load_average)}; "
          f"{time.time() - started:.0f} s")
    for title, cells in sections.items():
        print(f"\n{title}")
        for cell in cells:
            print(f"  {cell.what:<58} {fmt(cell.median(), '.3f'):>10}   ratio {fmt(cell.ratio(), '.3f')}"
                  f"   (values {', '.join(fmt(v, '.3f') for v in cell.values)})")
    if args.json:
        args.json.write_text(json.dumps({s: [c.__dict__ for c in cells] for s, cells in sections.items()},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
