"""`specli export`: the same target, drafter and settings as a serving engine's command line.

A run's plan (runplan.plan_run: models.toml and flags merged, as `specli run` would use them) becomes
the command that starts llama-server, vLLM or SGLang with the equivalent speculative decoding, and the
list of what does not carry over. No typer, no rich: the CLI prints an `Export`.

Flag names are those of the llama.cpp that llama-cpp-python vendors (common/arg.cpp): since 2026
llama-server speculates only when `--spec-type` says how (`-md` alone loads a draft and drafts nothing),
so the command always names `--spec-type` and `--spec-draft-n-max`. vLLM takes one JSON object,
`--speculative-config`; SGLang `--speculative-algorithm` and its step/token counts. vLLM and SGLang load
Hugging Face checkpoints, not GGUF files: the command names the repository a models.toml entry gives
(`hf = "OWNER/NAME"`) or a placeholder to replace.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specli.drafters.ngram import LONG_N, N_MAX, N_MIN
from specli.drafters.registry import NGRAM_LOOKUP, DrafterKind, drafter_kind
from specli.host import cpu_has_amx
from specli.llama import TILED_MM_VARIABLE
from specli.settings import AUTO, DEFAULT_HOST, DEFAULT_PORT, MAX_DRAFT_K, RunSettings, UsageProblem

ENGINES = ("llama-server", "vllm", "sglang")

# -k auto has no equivalent anywhere: without a bench to say better, this k (the middle of bench's
# default list 1,2,4,8, and close to what bench measures best for small pairs on a CPU).
DEFAULT_EXPORT_K = 4
# specli's n-gram lookup follows LONG_N-token matches, else tries the longest match of N_MAX down to
# N_MIN tokens (drafters/ngram.py). vLLM's prompt lookup does the latter (prompt_lookup_max/min);
# llama-server's ngram-simple matches one length, this one.
LLAMA_SERVER_NGRAM_LOOKUP = 3

TARGET_PLACEHOLDER = "HF_TARGET_REPO"
DRAFT_PLACEHOLDER = "HF_DRAFT_REPO"


class ExportError(UsageProblem):
    """An export that cannot be made (an unreadable --from-bench file, a drafter the engine lacks)."""


@dataclass(frozen=True)
class Export:
    """A serving engine's command line and what did not carry over."""

    engine: str
    argv: list[str]
    notes: list[str] = field(default_factory=list)
    k: int = DEFAULT_EXPORT_K
    k_source: str = ""  # where k came from: "-k", "--from-bench FILE", "default"
    head: int = 1  # argv words of the program itself ("vllm serve MODEL"), kept on the first line
    env: dict[str, str] = field(default_factory=dict)  # variables set for the program

    def shell(self) -> str:
        """The command, quoted for a POSIX shell, one option (and its value) per line."""
        lines: list[list[str]] = [[f"{k}={v}" for k, v in self.env.items()] + self.argv[:self.head]]
        for arg in self.argv[self.head:]:
            if arg.startswith("-") and not _is_number(arg):
                lines.append([arg])
            else:
                lines[-1].append(arg)
        return " \\\n    ".join(" ".join(shlex.quote(a) for a in line) for line in lines)

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "argv": self.argv, "env": self.env, "command": self.shell(),
                "notes": self.notes, "k": self.k, "k_source": self.k_source}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class ExportInput:
    """What an export needs from a plan: the files, the drafter, the merged settings, and the Hugging
    Face repositories models.toml names for the target and the draft (None: not given)."""

    target: Path
    draft: str | Path | None  # a draft model's path, a reserved drafter's name, or None (no drafting)
    ngram: bool  # n-gram lookup in front of the draft model
    settings: RunSettings
    target_hf: str | None = None
    draft_hf: str | None = None


# -- k -----------------------------------------------------------------------------------------------------


def read_bench_k(path: Path) -> tuple[int, str]:
    """The k a `specli bench --json` file measured best (its "best" configuration when that is a fixed k,
    else the fixed-k configuration with the highest median speedup), and a note saying so."""
    not_bench = f"--from-bench: {path} is not a JSON file written by `specli bench --json`"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ExportError(f"--from-bench: cannot read {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ExportError(not_bench) from None
    if not isinstance(document, dict) or document.get("tool") != "specli bench":
        raise ExportError(not_bench)
    best = document.get("best") or {}
    if isinstance(best.get("k"), int) and best["k"] > 0:
        return best["k"], (f"k = {best['k']}: the best of `specli bench` in {path.name} "
                           f"(median speedup {best.get('speedup')}× at T={best.get('temperature')})")
    fixed = [c for c in document.get("configs") or []
             if isinstance(c, dict) and isinstance(c.get("k"), int) and c["k"] > 0
             and isinstance((c.get("speedup") or {}).get("median"), (int, float))]
    if not fixed:
        raise ExportError(f"--from-bench: {path} measured no fixed k (only -k auto, or no complete pairs): "
                          "run `specli bench -k 1,2,4,8 --json FILE`")
    top = max(fixed, key=lambda c: c["speedup"]["median"])
    return top["k"], (f"k = {top['k']}: the best fixed k of `specli bench` in {path.name} "
                      f"(median speedup {top['speedup']['median']:.2f}× at T={top.get('temperature')}; "
                      "its overall best was -k auto, which has no equivalent)")


def choose_k(settings: RunSettings, bench_file: Path | None) -> tuple[int, str, list[str]]:
    """The k to export, where it came from, and notes. A fixed -k carries over as it is; -k auto takes
    the bench file's best k, or DEFAULT_EXPORT_K."""
    if bench_file is not None:
        k, why = read_bench_k(bench_file)
        notes = [why]
        if settings.draft_max != AUTO and settings.draft_max != k:
            notes.append(f"-k {settings.draft_max} was given too: --from-bench's k = {k} is used")
        return k, f"--from-bench {bench_file}", notes
    if settings.draft_max != AUTO:
        return int(settings.draft_max), "-k", []
    return DEFAULT_EXPORT_K, "default", [
        f"-k auto (specli picks k each round from measured costs and draft confidence) has no equivalent: "
        f"k = {DEFAULT_EXPORT_K} is used; measure the best k here with `specli bench -k 1,2,4,8 --json "
        "results.json` and export with --from-bench results.json"]


# -- the engines -------------------------------------------------------------------------------------------


def build_export(spec: ExportInput, engine: str, *, bench_file: Path | None = None,
                 host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> Export:
    """The `engine` command equivalent to running `spec` with specli, and what does not carry over."""
    if engine not in ENGINES:
        raise ExportError(f"--to must be one of {', '.join(ENGINES)}, got {engine!r}")
    k, k_source, notes = choose_k(spec.settings, bench_file)
    if spec.draft is not None and k == 0:
        notes.append("-k 0 drafts nothing: the command speculates with no drafter")
    drafter = _drafter(spec) if k > 0 else None
    build = {"llama-server": _llama_server, "vllm": _vllm, "sglang": _sglang}[engine]
    argv, engine_notes = build(spec, drafter, k, host, port)
    notes += engine_notes
    head = {"llama-server": 1, "vllm": 3, "sglang": 3}[engine]
    env = _environment(engine, spec.settings)
    if spec.settings.same_as_plain and drafter is not None:
        notes.append("--same-as-plain (a seeded speculative run prints exactly the plain run's tokens) "
                     "exists nowhere else: the engine keeps the target's distribution at best, not its "
                     "seeded sequence")
    notes.append("per request, not on the command line: max_tokens (specli's -n "
                 f"{spec.settings.max_tokens}), stop texts, and any sampling a client sets itself")
    return Export(engine, argv, notes, k, k_source, head, env)


def _environment(engine: str, s: RunSettings) -> dict[str, str]:
    """The variables the engine runs with: its batch-invariant mode where it has one in the environment
    (llama.cpp's CPU backend, vLLM), for specli's --batch-invariant."""
    if not s.batch_invariant:
        return {}
    return {"llama-server": {TILED_MM_VARIABLE: "0"}, "vllm": {"VLLM_BATCH_INVARIANT": "1"}}.get(engine, {})


@dataclass(frozen=True)
class Drafting:
    """The drafter to export: its kind (the registry's: what other engines call it), and whether n-gram
    lookup goes in front of its draft model (--ngram)."""

    kind: DrafterKind
    combined: bool


def _drafter(spec: ExportInput) -> Drafting | None:
    kind = drafter_kind(spec.draft)
    return None if kind is None else Drafting(kind, spec.ngram and kind.uses_model)


def _gpu_layers(n: int) -> str:
    return "all" if n < 0 else str(n)


def _llama_server(spec: ExportInput, drafter: Drafting | None, k: int, host: str,
                  port: int) -> tuple[list[str], list[str]]:
    s = spec.settings
    argv = ["llama-server", "-m", str(spec.target)]
    notes: list[str] = []
    types: list[str] = []
    if drafter is not None:
        if not drafter.kind.reserved:  # a file: a draft model or a trained head
            argv += ["-md", str(spec.draft)]
        if drafter.combined:
            types.append(NGRAM_LOOKUP.equivalents.llama_server)
        types.append(drafter.kind.equivalents.llama_server)
    argv += ["--spec-type", ",".join(types) or "none", "--spec-draft-n-max", str(k)]
    if NGRAM_LOOKUP.equivalents.llama_server in types:
        # ngram-simple drafts up to size-m tokens after a size-n match (llama.cpp common/ngram-map.cpp)
        argv += ["--spec-ngram-simple-size-n", str(LLAMA_SERVER_NGRAM_LOOKUP),
                 "--spec-ngram-simple-size-m", str(k)]
        notes.append(f"n-gram lookup: specli follows a {LONG_N}-token match for up to {MAX_DRAFT_K} tokens, "
                     f"else the longest of the last {N_MAX}...{N_MIN} tokens; "
                     f"llama-server's ngram-simple matches exactly {LLAMA_SERVER_NGRAM_LOOKUP} "
                     "(--spec-ngram-simple-size-n); on long copies its --spec-type ngram-mod at its "
                     "defaults was the fastest of its types (lab/history.md)")
    if drafter is not None and drafter.kind.takes_p_min:
        argv += ["--spec-draft-p-min", f"{s.draft_p_min:g}"]
    argv += ["-c", str(s.ctx), "-ngl", _gpu_layers(s.gpu_layers)]
    if drafter is not None and not drafter.kind.reserved:
        argv += ["-ngld", _gpu_layers(s.gpu_layers)]
    if s.threads > 0:
        argv += ["-t", str(s.threads)]
    else:
        notes.append("threads: specli uses one per core; llama-server picks its own default (add -t N)")
    if s.batch_invariant or cpu_has_amx():
        argv += ["--no-repack"]
    if s.batch_invariant:
        # As specli loads models (llama.py, batch-invariant arithmetic): no tiled K-quant matmul (the
        # environment, _environment), no repacked weights, a BF16 cache on the CPU.
        argv += ["-ctk", "bf16", "-ctv", "bf16"] if s.gpu_layers == 0 else []
        notes.append(f"batch-invariant arithmetic ({TILED_MM_VARIABLE}=0, --no-repack"
                     + (", -ctk/-ctv bf16" if s.gpu_layers == 0 else "") + "): a token's logits do not "
                     "depend on the batch it is computed in, as in specli; for llama.cpp's fastest prompt "
                     "evaluation drop them (specli's --no-batch-invariant)")
    if cpu_has_amx():
        # As specli loads models here (llama.ModelOptions.repack): repacked weights run llama.cpp's AMX
        # kernels, which crash on every multi-token batch on some Xeons.
        notes.append("--no-repack: this CPU has AMX, whose llama.cpp kernels (used by repacked weights) "
                     "crash on some Xeons (llama.cpp issue #20824); drop it on a machine where they work")
    argv += ["--temp", f"{s.temp:g}", "--top-k", str(s.top_k), "--top-p", f"{s.top_p:g}",
             "--min-p", f"{s.min_p:g}"]
    if s.seed is not None:
        argv += ["--seed", str(s.seed)]
    if s.ignore_eos:
        argv += ["--ignore-eos"]
    argv += ["--host", host, "--port", str(port)]
    if drafter is not None:
        notes.append("acceptance: llama-server accepts a draft token when the target's own sample equals "
                     "it (sample-and-match); specli's rule accepts by probability ratio (--no-same-as-plain) "
                     "or by the same match (--same-as-plain): the distribution is the target's either way, "
                     "the acceptance rates differ at T > 0")
    notes.append("the sampling flags are llama-server's defaults for requests that do not set their own "
                 "(temperature, top_k, top_p, min_p, seed in a request win); several slots (-np) share "
                 "the context -c")
    return argv, notes


def _hf(spec: ExportInput, engine: str) -> tuple[str, str | None, list[str]]:
    notes = []
    target = spec.target_hf or TARGET_PLACEHOLDER
    draft = None
    if spec.target_hf is None:
        notes.append(f"{engine} loads Hugging Face checkpoints, not GGUF: replace {TARGET_PLACEHOLDER} with "
                     f"the repository of {spec.target.name}'s model (or add hf = \"OWNER/NAME\" to its "
                     "models.toml entry)")
    kind = drafter_kind(spec.draft)
    if kind is not None and not kind.reserved:
        draft = spec.draft_hf or DRAFT_PLACEHOLDER
        if spec.draft_hf is None:
            notes.append(f"replace {DRAFT_PLACEHOLDER} with the Hugging Face repository of the draft "
                         f"{Path(str(spec.draft)).name} (or add hf = \"OWNER/NAME\" to its models.toml "
                         "entry)")
    if spec.target_hf is not None or spec.draft_hf is not None:
        notes.append(f"{engine} loads the full-precision checkpoints named by hf = in models.toml, not the "
                     "quantised GGUF files: speed, memory and the exact outputs differ")
    return target, draft, notes


def _sampling_request(s: RunSettings) -> dict[str, Any]:
    # top_k: specli's 0 (off) is -1 in vLLM and SGLang
    out: dict[str, Any] = {"temperature": s.temp, "top_k": s.top_k if s.top_k > 0 else -1, "top_p": s.top_p,
                           "min_p": s.min_p}
    if s.seed is not None:
        out["seed"] = s.seed
    return out


def _vllm(spec: ExportInput, drafter: Drafting | None, k: int, host: str,
          port: int) -> tuple[list[str], list[str]]:
    s = spec.settings
    target, draft, notes = _hf(spec, "vLLM")
    argv = ["vllm", "serve", target]
    if s.batch_invariant:
        notes.append("VLLM_BATCH_INVARIANT=1: vLLM's batch-invariant kernels, the counterpart of specli's "
                     "--batch-invariant (on the GPUs and attention backends vLLM supports it on)")
    method = drafter.kind.equivalents.vllm if drafter is not None else None
    if method is not None:
        config: dict[str, Any] = {"method": method}
        if draft is not None:
            config["model"] = draft
        config["num_speculative_tokens"] = k
        if method == NGRAM_LOOKUP.equivalents.vllm:  # vLLM's prompt lookup: the lengths specli's tries
            config |= {"prompt_lookup_max": N_MAX, "prompt_lookup_min": N_MIN}
        argv += ["--speculative-config", json.dumps(config)]
    notes += _missing_equivalents("vLLM", drafter, method is not None, s.draft_p_min)
    argv += ["--max-model-len", str(s.ctx)]
    argv += ["--generation-config", "vllm", "--override-generation-config", json.dumps(_sampling_request(s))]
    if s.seed is not None:
        argv += ["--seed", str(s.seed)]
    argv += ["--host", host, "--port", str(port)]
    notes.append("threads and GPU layers do not apply: vLLM runs the whole model on its GPUs "
                 "(--tensor-parallel-size N to split it)")
    if drafter is not None:
        notes.append("acceptance: vLLM verifies by rejection sampling (the target's distribution, like "
                     "specli's --no-same-as-plain), not specli's seeded same-as-plain rule")
    return argv, notes


def _missing_equivalents(engine: str, drafter: Drafting | None, has_method: bool, p_min: float) -> list[str]:
    """What of specli's drafting `engine` (vLLM, SGLang) cannot express, one note each."""
    if drafter is None:
        return []
    notes = []
    if not has_method:
        notes.append(f"{engine} has no equivalent of {drafter.kind.description.split(':')[0]} "
                     f"({drafter.kind.name}): the command serves without speculative decoding")
    if drafter.combined:
        notes.append(f"combined drafting (--ngram) has no {engine} equivalent: the draft model alone drafts")
    if drafter.kind.takes_p_min and p_min > 0:
        notes.append(f"--draft-p-min {p_min:g} has no {engine} equivalent: every round drafts k tokens")
    return notes


def _sglang(spec: ExportInput, drafter: Drafting | None, k: int, host: str,
            port: int) -> tuple[list[str], list[str]]:
    s = spec.settings
    target, draft, notes = _hf(spec, "SGLang")
    argv = ["python", "-m", "sglang.launch_server", "--model-path", target]
    if s.batch_invariant:
        argv += ["--enable-deterministic-inference"]
        notes.append("--enable-deterministic-inference: SGLang's batch-invariant mode, the counterpart of "
                     "specli's --batch-invariant (FlashInfer, FA3 and Triton attention backends)")
    algorithm = drafter.kind.equivalents.sglang if drafter is not None else None
    if algorithm is not None:
        argv += ["--speculative-algorithm", algorithm]
        if draft is not None:
            argv += ["--speculative-draft-model-path", draft]
        if algorithm == NGRAM_LOOKUP.equivalents.sglang:
            # NGRAM verifies a tree of candidates: the draft tokens per round are its size
            argv += ["--speculative-num-draft-tokens", str(k + 1)]
            notes.append("SGLang's NGRAM speculation runs on CUDA only")
        else:
            # one chain of k draft steps (top-k 1), verified as k + 1 tokens
            argv += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                     "--speculative-num-draft-tokens", str(k + 1)]
    notes += _missing_equivalents("SGLang", drafter, algorithm is not None, s.draft_p_min)
    argv += ["--context-length", str(s.ctx)]
    if s.seed is not None:
        argv += ["--random-seed", str(s.seed)]
    argv += ["--host", host, "--port", str(port)]
    notes.append("sampling is per request in SGLang: send " + json.dumps(_sampling_request(s)) +
                 " with each request (there is no server-wide default)")
    notes.append("threads and GPU layers do not apply: SGLang runs the whole model on its GPUs "
                 "(--tp N to split it)")
    return argv, notes


def export_input(plan: Any, hf_repos: Mapping[str, str | None] | None = None) -> ExportInput:
    """An ExportInput from a runplan.Plan and the Hugging Face repositories of its models ("target",
    "draft": from models.toml's hf keys)."""
    repos = hf_repos or {}
    return ExportInput(target=plan.target, draft=plan.draft, ngram=plan.ngram, settings=plan.settings,
                       target_hf=repos.get("target"), draft_hf=repos.get("draft"))


def hf_repos(plan: Any, config_path: Path | None) -> dict[str, str | None]:
    """The hf = keys of the models.toml entries of the plan's target and draft files (None where a
    file has no entry, or the entry no hf key)."""
    from specli.config import find_config, load_config

    found = find_config(config_path)
    if found is None:
        return {"target": None, "draft": None}
    cfg = load_config(found)

    def hf_of(path: Path | None) -> str | None:
        entry = cfg.resolve(str(path)).entry if path is not None else None
        return entry.hf if entry is not None else None

    return {"target": hf_of(plan.target), "draft": hf_of(plan.draft_model)}
