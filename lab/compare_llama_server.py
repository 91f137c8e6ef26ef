"""specli's defaults side by side with llama-server's speculative types, interleaved, on one machine.

    python lab/compare_llama_server.py [--target T.gguf] [--draft D.gguf] [-n 256] [--repeat 3]
        [--temp 0,0.8] [--prompt NAME ... | --token-prompt NAME=IDS.json ...] [--defaults-only | --n8-only]
        [-t 2] [--settle 2] [--seed 1000] [--json out.json]

Build llama-server first (lab/build_llama_tools.sh builds it from the llama.cpp that
llama-cpp-python vendors). Each repetition runs specli and every server configuration back to back,
in a rotating order. Only the side being measured is alive: a server is started on a free 127.0.0.1
port for its one request and stopped after it (so no type carries what one request taught it into the
next, below), and every measurement waits --settle seconds first, with nothing else of this script
running. Without --draft: `specli run --draft ngram` (its defaults: -k auto) against llama-server's
ngram-mod, ngram-map-k and ngram-simple, each at its defaults and drafting at most 8. With --draft:
`specli run --draft D` against draft-simple at --spec-draft-n-max 2, 4 and 8.

Every generation starts from nothing learned, as `specli run` does: ngram-mod keeps its n-gram table
across requests (llama.cpp common/speculative.cpp: "shared across all sequences", not reset by
begin()), so a server kept alive would draft the first run's answer in the second (on the
large-vocabulary model: 496/496 drafts accepted where no other type found one match); ngram-map-k
keeps each key's accepted count for keys inside a prompt seen before (common/ngram-map.cpp: begin()
drops only entries past the new prompt), so its second request of Gemma's repetitive prompt drafted
242 tokens for the same 194 accepted (337 the first time) and ran 98-100 tok/s instead of 82-88. A
server per request rules that out for every type; it does not cost the server a cold start (a fresh
server, or one that first answered a short unrelated request: the same rate within 3 %).

Rates, both over the whole generation with the prompt excluded: specli's GenerationStats tokens/s
(`specli run --json`), the server's own timings.predicted_per_second. Every run ignores EOS and uses
the same seed, temperature and sampling filters (llama.cpp's defaults: top-k 40, top-p 0.95,
min-p 0.05). Ratio: median over repetitions of specli / the server config in the same repetition;
each cell also prints specli's lowest and highest rate, so a ratio can be read against its spread,
and the rate over all of each side's runs (their harmonic mean: every run emits n tokens), the figure
for sampled text, where each side samples its own text with its own random numbers and a text that
copies little and one that copies much differ several times over (Gemma's copy-edit at T 0.8:
specli 46-167 tok/s over 5 seeds): use many repetitions there. At T > 0 each cell also gives every
side's rate at the same predictable share (the share of a text's tokens that a 3-token lookup
predicts, `predictable_share`): a line of seconds per token in that share fitted to each side's runs,
read at the mean share of all of them, which compares the sides text for text rather than by the
texts each happened to draw. For the same texts on both sides, measured rather than fitted, use
compare_same_text.py: it runs specli on the server's own sampled text.
"""

from __future__ import annotations

import argparse
import difflib
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    GEMMA_HINT,
    GPU_LAYERS,
    find_tool,
    gemma_path,
    no_repack_flags,
    stop_process,
    wait_healthy,
)
from compare_llamacpp import PROMPTS  # noqa: E402

NGRAM_CONFIGS = [
    ("ngram-mod", ["--spec-type", "ngram-mod"]),
    # --spec-draft-n-max is a draft model's: each n-gram type has its own length flags. ngram-mod
    # drops a draft shorter than its n-min (default 48), so n8 lowers that too.
    ("ngram-mod n8", ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "8",
                      "--spec-ngram-mod-n-min", "8"]),
    ("ngram-map-k", ["--spec-type", "ngram-map-k"]),
    ("ngram-map-k n8", ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-m", "8"]),
    ("ngram-simple", ["--spec-type", "ngram-simple"]),
    # ngram-simple drafts nothing shorter than its pattern (size-n, default 12): an 8-token pattern.
    ("ngram-simple n8", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "8",
                         "--spec-ngram-simple-size-m", "8"]),
]


def draft_configs(draft: str) -> list[tuple[str, list[str]]]:
    return [(f"draft-simple n{n}",
             ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(n)]) for n in (2, 4, 8)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One llama-server configuration, alive only from start() to stop()."""

    def __init__(self, binary: Path, target: str, label: str, flags: list[str], threads: int,
                 ctx: int) -> None:
        self.label = label
        self._argv = [str(binary), "-m", target, "--host", "127.0.0.1", "-t", str(threads), "-c", str(ctx),
                      "-np", "1", "--no-webui", *no_repack_flags("llama-server"), *flags]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.port = free_port()
        self.log = open(f"/tmp/llama-server-{self.port}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen([*self._argv, "--port", str(self.port)], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        wait_healthy(self.proc, f"http://127.0.0.1:{self.port}", f"{self.label} (log: {self.log.name})")

    def complete(self, prompt: str | list[int], n: int, temp: float, seed: int) -> dict:
        # The server's own endpoint rather than /v1/completions (the same generation): it can return
        # the generated token ids, which the predictability share below is counted on.
        body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": temp, "seed": seed,
                           "ignore_eos": True, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                           "cache_prompt": False, "return_tokens": True}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as r:
            answer = json.load(r)
        timings = answer["timings"]
        return {"tps": timings["predicted_per_second"], "drafted": timings.get("draft_n", 0),
                "accepted": timings.get("draft_n_accepted", 0), "text": answer["content"],
                "tokens": answer.get("tokens", [])}

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 10)
            self.log.close()
            self.proc = None


def specli_run(target: str, draft: str, prompt: str, n: int, temp: float, seed: int, threads: int,
               ctx: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "specli.cli", "run", "--target", target, "--draft", draft, "-n", str(n),
         "--temp", str(temp), "-s", str(seed), "--ignore-eos", "-t", str(threads), "-c", str(ctx),
         "-ngl", str(GPU_LAYERS), "--json", prompt],
        capture_output=True, text=True, timeout=900,
    )
    if proc.returncode:
        raise SystemExit(f"specli: {proc.stderr.strip()[-400:]}")
    out = json.loads(proc.stdout)
    stats = out["stats"]
    return {"tps": stats["tokens_per_second"], "drafted": stats["drafted"], "accepted": stats["accepted"],
            "text": out["text"], "tokens": out["tokens"]}


# A fresh process generating from token ids with `specli run`'s defaults (the CLI takes text only).
# BEFORE is code run first in it, with `extra` at hand (compare_same_text.py scripts the noise there).
_SPECLI_FROM_TOKENS = """
import json, sys
from specli.api import load
from specli.engine import GenerationParams
from specli.settings import RunSettings
target, draft, ids, n, temp, seed, threads, ctx, extra, gpu_layers = json.loads(sys.argv[1])
BEFORE
settings = RunSettings(max_tokens=n, temp=temp, seed=seed, ignore_eos=True, threads=threads, ctx=ctx)
with load(target, draft, n_ctx=ctx, n_threads=threads, n_gpu_layers=gpu_layers) as spec:
    generation = spec.generate(ids, GenerationParams.of(settings))
    generation.complete()
    print(json.dumps({**generation.stats.as_dict(), "tokens": list(generation.tokens)}))
"""


def specli_tokens(target: str, draft: str, ids: list[int], n: int, temp: float, seed: int, threads: int,
                  ctx: int, before: str = "", extra: object = None) -> dict:
    args = json.dumps([target, draft, ids, n, temp, seed, threads, ctx, extra, GPU_LAYERS])
    code = _SPECLI_FROM_TOKENS.replace("BEFORE", before)
    proc = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"specli: {proc.stderr.strip()[-400:]}")
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"tps": stats["tokens_per_second"], "drafted": stats["drafted"], "accepted": stats["accepted"],
            "tokens": stats["tokens"]}


def token_prompts(specs: list[str]) -> dict[str, list[int]]:
    """NAME=FILE pairs: FILE holds a JSON list of token ids (BOS included), sent as they are to both
    sides (for a model whose text does not survive detokenizing and tokenizing again)."""
    out = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        ids = json.loads(Path(path).read_text())
        if not path or not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise SystemExit(f"--token-prompt {spec}: want NAME=FILE with a JSON list of token ids")
        out[name] = ids
    return out


# A sampled text "copies" when passages of at least COPY_RUN characters of the prompt cover this share
# of it: the rates of texts that copy and of texts that do not are several times apart.
COPY_RUN, COPY_SHARE = 20, 0.4


def copied_share(prompt: str, text: str) -> float:
    """The share of `text` made of passages of at least COPY_RUN characters found in `prompt`."""
    blocks = difflib.SequenceMatcher(None, prompt, text, autojunk=False).get_matching_blocks()
    return sum(b.size for b in blocks if b.size >= COPY_RUN) / max(1, len(text))


# The tokens before a position that a lookup matches on (`predictable_share`).
LOOKUP_N = 3


def predictable_share(prompt_ids: list[int], generated: list[int], n: int = LOOKUP_N) -> float:
    """The share of `generated` that a plain lookup predicts: tokens whose n predecessors occurred
    before (in the prompt or the text so far) followed by this same token, at their latest
    occurrence. How much a text repeats the prompt or itself, counted the same way for every side;
    a sampled text's rate follows it closely (specli: seconds per token within ~1 ms of a straight
    line in it on Gemma's copy-edit at T 0.8), so it puts the two sides' texts on one scale."""
    seq = [*prompt_ids, *generated]
    latest: dict[tuple[int, ...], int] = {}
    for j in range(n, len(prompt_ids)):
        latest[tuple(seq[j - n:j])] = j
    hits = 0
    for j in range(len(prompt_ids), len(seq)):
        key = tuple(seq[j - n:j])
        seen = latest.get(key)
        hits += seen is not None and seq[seen] == seq[j]
        latest[key] = j
    return hits / max(1, len(generated))


def at_equal_predictability(samples: dict[str, list[dict]], prompt_ids: list[int]) -> dict[str, float] | None:
    """Each side's rate at the same text: a straight line of seconds per token in the predictable
    share fitted to each side's runs, read at the mean share of all of them. None when a side's runs
    lack token ids, their shares do not spread (no line to fit) or a line reads no time there."""
    if any("tokens" not in g or not g["tokens"] for runs in samples.values() for g in runs):
        return None
    shares = {lab: [predictable_share(prompt_ids, g["tokens"]) for g in runs]
              for lab, runs in samples.items()}
    everything = [x for xs in shares.values() for x in xs]
    if any(max(xs) - min(xs) < 0.05 for xs in shares.values()):
        return None
    middle = statistics.fmean(everything)
    rates = {}
    for lab, runs in samples.items():
        slope, intercept = statistics.linear_regression(shares[lab], [1.0 / g["tps"] for g in runs])
        if intercept + slope * middle <= 0.0:
            return None
        rates[lab] = 1.0 / (intercept + slope * middle)
    return {"share": middle, **{f"mean share {lab}": statistics.fmean(shares[lab]) for lab in samples},
            **rates}


def report_cell(name: str, temp: float, samples: dict[str, list[dict]], prompt: str | None,
                prompt_ids: list[int]) -> dict:
    """Print one prompt and temperature's figures; the row for --json."""
    labels = list(samples)
    medians = {lab: statistics.median(g["tps"] for g in samples[lab]) for lab in labels}
    best = max(labels[1:], key=medians.__getitem__)
    pairs = [a["tps"] / b["tps"] for a, b in zip(samples["specli"], samples[best], strict=True)]
    acceptance = {lab: (sum(g["accepted"] for g in samples[lab]), sum(g["drafted"] for g in samples[lab]))
                  for lab in labels}
    # Every run emits n tokens, so the rate over all of a side's runs is the harmonic mean: what a
    # user waits for on average, where a median hides sampled texts that copy little.
    pooled = {lab: statistics.harmonic_mean([g["tps"] for g in samples[lab]]) for lab in labels}
    pooled_best = max(labels[1:], key=pooled.__getitem__)
    own = [g["tps"] for g in samples["specli"]]
    print(f"{name:<11} {temp:>4g}  " + "  ".join(f"{medians[lab]:>15.1f}" for lab in labels)
          + f"   {statistics.median(pairs):.2f} vs {best}", flush=True)
    print(f"   over all runs: specli {pooled['specli']:.1f} tok/s, {pooled_best} {pooled[pooled_best]:.1f}: "
          f"{pooled['specli'] / pooled[pooled_best]:.2f}", flush=True)
    print(f"   specli {min(own):.1f}-{max(own):.1f} tok/s over {len(own)} runs; per pair: "
          + ", ".join(f"{r:.2f}" for r in pairs), flush=True)
    print("   accepted/drafted: " + ", ".join(f"{lab} {a}/{d}" for lab, (a, d) in acceptance.items()),
          flush=True)
    if temp > 0 and prompt is not None:
        # Each side samples its own text: say how many copied, and the rates of each kind apart.
        parts = []
        for lab in labels:
            copies = [copied_share(prompt, g["text"]) >= COPY_SHARE for g in samples[lab]]
            kinds = [[g["tps"] for g, c in zip(samples[lab], copies, strict=True) if c == want]
                     for want in (True, False)]
            parts.append(f"{lab} {sum(copies)}/{len(copies)} ("
                         + " / ".join(f"{statistics.median(k):.1f}" if k else "-" for k in kinds) + ")")
        print(f"   texts that copy the prompt (median tok/s of those / of the rest): {', '.join(parts)}",
              flush=True)
    equal = at_equal_predictability(samples, prompt_ids) if temp > 0 else None
    if equal is not None:
        # Each side samples its own text, and how much it repeats decides its rate: compare at one.
        fitted_best = max(labels[1:], key=equal.__getitem__)
        print(f"   at the same predictable share ({equal['share']:.2f}; each side's mean: "
              + ", ".join(f"{lab} {equal[f'mean share {lab}']:.2f}" for lab in labels) + "): "
              + ", ".join(f"{lab} {equal[lab]:.1f}" for lab in labels)
              + f" tok/s; specli / {fitted_best} {equal['specli'] / equal[fitted_best]:.2f}", flush=True)
    return {"prompt": name, "temp": temp, "tps": medians, "best_server": best,
            "at_equal_predictability": equal,
            "ratio": statistics.median(pairs), "pooled_tps": pooled,
            "pooled_ratio": pooled["specli"] / pooled[pooled_best], "accepted_drafted": acceptance,
            "samples": samples}


def add_run_arguments(ap: argparse.ArgumentParser) -> None:
    """Threads, context, pauses, seeds and --json, as every llama-server comparison takes them."""
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("--settle", type=float, default=2.0, metavar="SECONDS",
                    help="pause before each measurement, with nothing else of this script running")
    ap.add_argument("--seed", type=int, default=1000, help="the first repetition's seed (then +1 each)")
    ap.add_argument("--json", dest="json_path")


def server_and_target(target: str | None) -> tuple[Path, str]:
    """The llama-server binary and the target GGUF (default: Gemma 3 270M), or a one-line exit."""
    binary = find_tool("llama-server")
    if binary is None:
        raise SystemExit("llama-server not found: run lab/build_llama_tools.sh")
    target = target or (str(gemma_path()) if gemma_path() else None)
    if target is None:
        raise SystemExit(GEMMA_HINT)
    return binary, target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft", help="a draft model: compare with draft-simple (default: n-gram types)")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--temp", default="0,0.8")
    ap.add_argument("--prompt", action="append", choices=sorted(PROMPTS))
    ap.add_argument("--token-prompt", action="append", default=[], metavar="NAME=FILE",
                    help="a prompt as a JSON list of token ids (replaces the built-in prompts)")
    ap.add_argument("--defaults-only", action="store_true", help="each type at its defaults only (no n8)")
    ap.add_argument("--n8-only", action="store_true", help="each type drafting at most 8 only")
    add_run_arguments(ap)
    opts = ap.parse_args()
    tokens = token_prompts(opts.token_prompt)
    binary, target = server_and_target(opts.target)
    configs = draft_configs(opts.draft) if opts.draft else NGRAM_CONFIGS
    if not opts.draft and (opts.defaults_only or opts.n8_only):
        configs = [(label, flags) for label, flags in configs if label.endswith(" n8") == opts.n8_only]
    servers = [Server(binary, target, label, flags, opts.threads, opts.ctx) for label, flags in configs]
    vocab = llama_cpp.Llama(model_path=target, vocab_only=True, verbose=False)  # prompts' ids, for the share
    rows = []
    try:
        labels = ["specli", *(s.label for s in servers)]
        header = "  ".join(f"{lab:>15}" for lab in labels)
        print(f"{'prompt':<11} {'T':>4}  {header}   specli/best", flush=True)
        turn = 0
        for temp in (float(t) for t in opts.temp.split(",")):
            for name in list(tokens) or opts.prompt or ["repetitive", "copy-edit", "code"]:
                samples: dict[str, list[dict]] = {lab: [] for lab in labels}
                for rep in range(opts.repeat):
                    seed = opts.seed + rep
                    order = labels[turn % len(labels):] + labels[: turn % len(labels)]
                    turn += 1
                    for lab in order:
                        time.sleep(opts.settle)
                        if lab == "specli" and name in tokens:
                            got = specli_tokens(target, opts.draft or "ngram", tokens[name], opts.n, temp,
                                                seed, opts.threads, opts.ctx)
                        elif lab == "specli":
                            got = specli_run(target, opts.draft or "ngram", PROMPTS[name], opts.n, temp,
                                             seed, opts.threads, opts.ctx)
                        else:
                            server = next(s for s in servers if s.label == lab)
                            server.start()
                            time.sleep(opts.settle)  # the load's page-cache and allocator work
                            try:
                                got = server.complete(tokens.get(name, PROMPTS.get(name)), opts.n, temp,
                                                      seed)
                            finally:
                                server.stop()
                        samples[lab].append(got)
                rows.append(report_cell(name, temp, samples, None if name in tokens else PROMPTS[name],
                                        tokens.get(name) or vocab.tokenize(PROMPTS[name].encode(),
                                                                           add_bos=True, special=True)))
    finally:
        for s in servers:
            s.stop()
    if opts.json_path:
        Path(opts.json_path).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
