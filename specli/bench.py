"""`specli bench`: does speculation pay for this pair on this machine? Measured, paired, explained.

The models are loaded once. For every (temperature, k) and every prompt, a plain target run and a
speculative run on the same prompt and seed are made back to back, `repeat` times, so machine drift
(thermal throttling, other load) hits both halves of a pair alike; the figure that matters is the
ratio within each pair. Both runs start from an empty cache and time only generation (prompt
evaluation is reported apart), so every run measures the same thing.

Once per bench, the target's verify cost T_v(m) is measured for batch sizes m = 1 .. max k + 1: on a
CPU a batch of 5 costs about twice one token, on a GPU almost the same. With the measured acceptance
and draft cost it gives Leviathan et al.'s predicted speedup; measured / predicted (the efficiency)
shows how much goes to overheads the formula does not model (sampling, bookkeeping).

This module computes and returns dataclasses; specli.ui.bench_view renders them.
"""

from __future__ import annotations

import csv
import gc
import io
import json
import os
import platform
import statistics
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import numpy as np

from specli.drafters.base import Drafter
from specli.engine import GenerationParams, SpeculativeEngine
from specli.errors import UsageProblem
from specli.fileio import atomic_write_text
from specli.llama import Model, ModelOptions
from specli.options import temperature_problem
from specli.policy import AutoK
from specli.sampling import DEFAULT_SAMPLING, SamplingParams
from specli.stats import GenerationStats, expected_tokens_per_round

NGRAM = "ngram"
AUTO = "auto"
BENCH_FORMAT = 1  # bumped when the JSON layout changes incompatibly

K = int | str  # a fixed draft length, or "auto"


class BenchError(UsageProblem, ValueError):
    """A bench option or input that cannot work (bad k list, unreadable prompts file ...)."""


class PromptFileError(BenchError):
    """The --prompts file cannot be read or holds no prompts."""


# -- prompts ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPrompt:
    name: str
    text: str
    kind: str = "custom"  # the regime it stands for (code, copy, story, chat) or "custom"


_CODE = '''import math


def mean_and_stdev(values: list[float]) -> tuple[float, float]:
    """Return the mean and the sample standard deviation of values."""
    if len(values) < 2:
        raise ValueError("need at least two values")
    mean = sum(values) / len(values)
    variance = sum((x - mean) ** 2 for x in values) / (len(values) - 1)
    return mean, math.sqrt(variance)


def median(values: list[float]) -> float:
    """Return the median of values."""
'''

_TYPO_TEXT = (
    "The old lighthouse stood at the edge of the cliff for more then two hundred years. Every night its "
    "keeper climbed the narow stairs, lit the great lamp and watched the ships pass safely throught the "
    "dark water. When the storms came, the light never failed, and the people of the vilage said that as "
    "long as the lighthouse was burning, no sailor would be lost at sea."
)

_CHAT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat are three simple ways to sleep better? Explain each in a sentence or two."
    "<|im_end|>\n<|im_start|>assistant\n"
)

BUILTIN_PROMPTS: tuple[BenchPrompt, ...] = (
    BenchPrompt("code", _CODE, "code"),
    BenchPrompt(
        "copy-edit",
        "Fix the spelling mistakes in the following paragraph and write out the whole corrected "
        f"paragraph.\n\nParagraph: {_TYPO_TEXT}\n\nCorrected paragraph:",
        "copy",
    ),
    BenchPrompt(
        "story",
        "Once upon a time, in a small village at the edge of a great forest, there lived a girl who",
        "story",
    ),
    BenchPrompt("chat", _CHAT, "chat"),
)


def parse_prompts(text: str, source: str = "<prompts>") -> list[BenchPrompt]:
    """Prompts from a file's text: JSONL objects {"name": ..., "prompt": ...} if the first non-blank
    line is such an object, else one prompt per line. Blank lines are skipped."""
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise PromptFileError(f"{source}: no prompts (the file is empty)")
    prompts: list[BenchPrompt] = []
    if _json_object(lines[0][1]) is not None:
        for lineno, line in lines:
            obj = _json_object(line)
            if obj is None or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
                raise PromptFileError(
                    f'{source}:{lineno}: expected a JSON object with a non-empty "prompt" string '
                    "(the file is read as JSONL because its first line is a JSON object)"
                )
            name = obj.get("name")
            prompts.append(BenchPrompt(str(name) if name not in (None, "") else f"prompt-{len(prompts) + 1}",
                                       obj["prompt"], str(obj.get("kind", "custom"))))
    else:
        prompts = [BenchPrompt(f"line-{lineno}", line) for lineno, line in lines]
    return _unique_names(prompts)


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    """Read a --prompts file (see parse_prompts); PromptFileError with a one-line reason otherwise."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PromptFileError(f"cannot read prompts file {path}: it is not UTF-8 text") from None
    except OSError as e:
        raise PromptFileError(f"cannot read prompts file {path}: {e.strerror or e}") from None
    return parse_prompts(text, str(path))


def _json_object(line: str) -> dict | None:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _unique_names(prompts: list[BenchPrompt]) -> list[BenchPrompt]:
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        n = seen.get(p.name, 0) + 1
        seen[p.name] = n
        out.append(p if n == 1 else BenchPrompt(f"{p.name}-{n}", p.text, p.kind))
    return out


# -- options ----------------------------------------------------------------------------------------------


def parse_k_list(value: str) -> list[K]:
    """'1,2,4,auto' -> [1, 2, 4, 'auto'] (each k in 1..64, no duplicates)."""
    out: list[K] = []
    for item in (s.strip() for s in value.split(",")):
        if not item:
            continue
        if item == AUTO:
            k: K = AUTO
        else:
            try:
                k = int(item)
            except ValueError:
                raise BenchError(f"-k: {item!r} is not a whole number or 'auto'") from None
            if not 1 <= k <= 64:
                raise BenchError(f"-k: {k} is out of range 1..64 (k = 0 is the plain baseline, always run)")
        if k not in out:
            out.append(k)
    if not out:
        raise BenchError("-k: give at least one draft length, e.g. 1,2,4,8 or auto")
    return out


def parse_temp_list(value: str) -> list[float]:
    """'0,0.7,1' -> [0.0, 0.7, 1.0] (each >= 0, no duplicates)."""
    out: list[float] = []
    for item in (s.strip() for s in value.split(",")):
        if not item:
            continue
        try:
            t = float(item)
        except ValueError:
            raise BenchError(f"--temp: {item!r} is not a number") from None
        if (why := temperature_problem(t)) is not None:
            raise BenchError(f"--temp: {item} is not a temperature: it {why}")
        if t not in out:
            out.append(t)
    if not out:
        raise BenchError("--temp: give at least one temperature, e.g. 0,0.7,1.0")
    return out


@dataclass
class BenchConfig:
    target: str | Path
    draft: str | Path  # a GGUF path, or "ngram" (prompt lookup, no model)
    ks: list[K] = field(default_factory=lambda: [1, 2, 4, 8])
    temps: list[float] = field(default_factory=lambda: [0.0, 0.7, 1.0])
    prompts: list[BenchPrompt] | None = None  # None: BUILTIN_PROMPTS
    max_tokens: int = 128
    repeat: int = 3
    n_ctx: int = 2048
    n_threads: int = 0  # 0: llama.default_threads()
    n_gpu_layers: int = 0
    seed: int = 0
    same_as_plain: bool = True  # drafts verified against the target's own keyed draw (see sampling)
    top_k: int = DEFAULT_SAMPLING.top_k  # the filters of `specli run`, so bench measures what run does
    top_p: float = DEFAULT_SAMPLING.top_p
    min_p: float = DEFAULT_SAMPLING.min_p
    draft_p_min: float = 0.0
    ngram: bool = False  # with a draft model: combined drafting (n-gram matches first)
    # As llama-bench: every run generates exactly max_tokens, so plain and speculative runs compare
    # the same amount of work even at T > 0, where they stop at different places.
    ignore_eos: bool = True
    warmup_tokens: int = 16
    curve_repeats: int = 8  # timed decodes per batch size (at least) for the verify-cost curve
    # Alternate which half of a pair runs first (plain-spec, spec-plain, ...), so that whatever the
    # first run of a pair does to the second (cache, clocks) does not favour one side.
    alternate_order: bool = True

    def prompt_list(self) -> list[BenchPrompt]:
        return list(self.prompts) if self.prompts is not None else list(BUILTIN_PROMPTS)

    def validate(self) -> None:
        if not self.ks:
            raise BenchError("no draft lengths to bench (-k)")
        for k in self.ks:
            if k != AUTO and not (isinstance(k, int) and 1 <= k <= 64):
                raise BenchError(f"-k: {k!r} is not a draft length in 1..64 or 'auto'")
        if not self.temps or any(not t >= 0 for t in self.temps):
            raise BenchError("--temp: need one or more temperatures >= 0")
        if self.max_tokens < 1:
            raise BenchError("-n must be at least 1")
        if self.repeat < 1:
            raise BenchError("--repeat must be at least 1")
        if not self.prompt_list():
            raise BenchError("no prompts to bench")
        if self.curve_repeats < 1:
            raise BenchError("curve_repeats must be at least 1")
        SamplingParams(temperature=1.0, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)  # validates

    def max_batch(self) -> int:
        """The largest verify batch the runs can make: max k + 1 (auto may reach AutoK's k_max)."""
        return max(AutoK().k_max if k == AUTO else int(k) for k in self.ks) + 1

    def sampling(self, temperature: float) -> SamplingParams:
        return SamplingParams(temperature=temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)


# -- progress (the UI implements it; None: silent) ---------------------------------------------------------


class BenchProgress(Protocol):
    def phase(self, name: str, total: int) -> None:
        """A phase starts: 'load', 'warm-up', 'verify cost' or 'runs', with `total` steps."""

    def step(self, detail: str = "") -> None:
        """One step of the current phase is done. Called only between timed sections."""


# -- records ----------------------------------------------------------------------------------------------


@dataclass
class Spread:
    """Distribution of a measured figure over runs or pairs."""

    n: int = 0
    median: float | None = None
    p25: float | None = None
    p75: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread:
        v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
        if v.size == 0:
            return cls()
        p25, med, p75 = np.percentile(v, [25, 50, 75])
        return cls(int(v.size), float(med), float(p25), float(p75), float(v.min()), float(v.max()))


@dataclass
class VerifyPoint:
    m: int  # batch size: the pending token + m - 1 drafts
    ms: float  # median wall time of one target decode of m tokens with logits for all of them
    min_ms: float
    max_ms: float
    samples: int


@dataclass
class VerifyCurve:
    points: list[VerifyPoint]
    prefix_tokens: int  # tokens in the cache when measured (positions the batch attends to)
    draft_ms_per_token: float | None  # the draft model's single-token decode (None: no draft model)

    def ms(self, m: int) -> float:
        """T_v(m) in ms; linear extrapolation past the measured sizes."""
        by_m = {p.m: p.ms for p in self.points}
        if m in by_m:
            return by_m[m]
        top = max(by_m)
        if m < 1 or len(by_m) < 2:
            return by_m[top] if m > top else by_m[min(by_m)]
        slope = max(0.0, by_m[top] - by_m.get(top - 1, by_m[top]))
        return by_m[top] + slope * (m - top)

    def ratio(self, m: int) -> float:
        return self.ms(m) / self.ms(1)

    def break_even_alpha(self, k: int, c_draft_ms: float) -> float | None:
        """The acceptance alpha at which drafting k tokens per round just matches plain decoding
        (None: no alpha below 1 is enough, because the round costs more than k + 1 plain tokens)."""
        t1, cost = self.ms(1), k * c_draft_ms + self.ms(k + 1)
        if (k + 1) * t1 <= cost:
            return None
        lo, hi = 0.0, 1.0
        for _ in range(50):
            mid = (lo + hi) / 2
            if expected_tokens_per_round(mid, k) * t1 < cost:
                lo = mid
            else:
                hi = mid
        return hi


@dataclass
class RunRecord:
    """One generation. A pair is a plain run and a speculative run with the same prompt and seed."""

    seq: int  # order of execution over the whole bench
    temperature: float
    k: K
    prompt: str
    repeat: int
    pair: int  # index of the pair within its (temperature, k)
    mode: str  # "plain" | "spec"
    position: int  # 0: ran first in its pair, 1: second
    seed: int
    n_prompt: int
    n_generated: int
    generation_seconds: float
    prompt_seconds: float
    tokens_per_second: float | None
    rounds: int
    drafted: int
    accepted: int
    rejections: int
    acceptance_rate: float | None
    alpha: float | None
    tokens_per_round: float | None
    mean_accepted: float | None  # accepted drafts per drafting round
    mean_k: float | None  # drafted per round, over all rounds
    draft_seconds: float
    verify_seconds: float
    other_seconds: float  # generation time not drafting or verifying
    decode_seconds: float
    stop_reason: str
    output_crc: int  # crc32 of the output token ids: greedy and same-as-plain pairs must agree
    k_per_round: list[int] = field(default_factory=list)
    predicted_speedup: float | None = None  # spec only, from the verify-cost curve
    speedup: float | None = None  # spec only: this run's tok/s over its pair's plain tok/s
    # spec only: the index of the first token where its output differs from its pair's plain run
    # (None: the same tokens)
    first_fork: int | None = None


@dataclass
class PromptResult:
    prompt: str
    plain_tps: Spread
    spec_tps: Spread
    speedup: Spread
    acceptance_rate: float | None
    tokens_per_round: float | None
    predicted_speedup: float | None


@dataclass
class ConfigResult:
    temperature: float
    k: K
    pairs: int
    plain_tps: Spread
    spec_tps: Spread
    speedup: Spread  # over the paired ratios spec/plain
    speedup_geomean: float | None
    wins: int  # pairs in which the speculative run was faster
    acceptance_rate: float | None
    alpha: float | None
    mean_accepted: float | None
    tokens_per_round: float | None
    mean_k: float | None
    c_draft_ms: float | None  # draft seconds per drafted token, as measured in the runs
    draft_share: float | None  # of speculative generation time
    verify_share: float | None
    other_share: float | None
    plain_other_share: float | None  # plain runs: generation time outside the target decode
    predicted_speedup: float | None
    efficiency: float | None  # measured median speedup / predicted
    # Pairs whose outputs must agree (greedy, or same-as-plain with a seed) but differ, and the token
    # index of each one's first difference: 0 mismatches where batched logits equal single-token ones.
    mismatches: int
    first_forks: list[int]
    short_runs: int  # runs that stopped before max_tokens (EOS): fewer tokens, noisier rate
    per_prompt: list[PromptResult] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"T={self.temperature:g} k={self.k}"


@dataclass
class ModelInfo:
    path: str
    file_bytes: int | None
    description: str
    n_params: int | None
    n_vocab: int | None
    n_ctx: int | None
    n_threads: int | None
    load_seconds: float


@dataclass
class BenchResult:
    config: BenchConfig
    started_at: str
    finished_at: str = ""
    machine: dict = field(default_factory=dict)
    target: ModelInfo | None = None
    draft: ModelInfo | None = None  # None for ngram
    drafter: str = ""
    prompts: list[dict] = field(default_factory=list)  # name, kind, tokens
    load_seconds: float = 0.0
    warmup_seconds: float = 0.0
    curve_seconds: float = 0.0
    runs_seconds: float = 0.0
    curve: VerifyCurve | None = None
    configs: list[ConfigResult] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    interrupted: bool = False

    @property
    def best(self) -> ConfigResult | None:
        """The configuration with the highest median paired speedup."""
        scored = [c for c in self.configs if c.speedup.median is not None]
        return max(scored, key=lambda c: c.speedup.median) if scored else None

    def to_dict(self) -> dict:
        cfg = self.config
        best = self.best
        return {
            "format": BENCH_FORMAT,
            "tool": "specli bench",
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "interrupted": self.interrupted,
            "machine": self.machine,
            "models": {
                "target": asdict(self.target) if self.target else None,
                "draft": asdict(self.draft) if self.draft else None,
                "drafter": self.drafter,
            },
            "options": {
                "ks": cfg.ks, "temperatures": cfg.temps, "max_tokens": cfg.max_tokens, "repeat": cfg.repeat,
                "n_ctx": cfg.n_ctx, "n_threads": self.target.n_threads if self.target else cfg.n_threads,
                "n_gpu_layers": cfg.n_gpu_layers, "seed": cfg.seed, "top_k": cfg.top_k, "top_p": cfg.top_p,
                "min_p": cfg.min_p, "draft_p_min": cfg.draft_p_min, "ngram": cfg.ngram,
                "warmup_tokens": cfg.warmup_tokens, "curve_repeats": cfg.curve_repeats,
                "alternate_order": cfg.alternate_order,
            },
            "prompts": self.prompts,
            "timings": {
                "load_seconds": _r(self.load_seconds), "warmup_seconds": _r(self.warmup_seconds),
                "verify_curve_seconds": _r(self.curve_seconds), "runs_seconds": _r(self.runs_seconds),
            },
            "verify_curve": None if self.curve is None else {
                "prefix_tokens": self.curve.prefix_tokens,
                "draft_ms_per_token": _r(self.curve.draft_ms_per_token),
                "points": [{**asdict(p), "ratio": _r(self.curve.ratio(p.m))} for p in self.curve.points],
            },
            "best": None if best is None else {"temperature": best.temperature, "k": best.k,
                                               "speedup": _r(best.speedup.median)},
            "configs": [_rounded(asdict(c)) for c in self.configs],
            "runs": [_rounded(asdict(r)) for r in self.runs],
        }


# -- running ----------------------------------------------------------------------------------------------


class _Loaded:
    """The models and the two engines built over them: plain and speculative share one target."""

    def __init__(self, config: BenchConfig) -> None:
        from specli.compat import require_compatible
        from specli.drafters.combined import CombinedDrafter
        from specli.drafters.model import DraftModelDrafter
        from specli.drafters.ngram import NGramDrafter

        self.draft_model: Model | None = None
        self.drafter: Drafter | None = None
        t0 = time.perf_counter()
        self.target = Model(config.target, ModelOptions(n_ctx=config.n_ctx, n_threads=config.n_threads,
                                                       n_gpu_layers=config.n_gpu_layers))
        self.target_load = time.perf_counter() - t0
        self.draft_load = 0.0
        try:
            if str(config.draft) == NGRAM:
                self.drafter = NGramDrafter()
            else:
                t0 = time.perf_counter()
                self.draft_model = Model(config.draft, ModelOptions(
                    n_ctx=self.target.n_ctx, n_threads=config.n_threads, n_gpu_layers=config.n_gpu_layers))
                self.draft_load = time.perf_counter() - t0
                require_compatible(self.target, self.draft_model)
                model_drafter = DraftModelDrafter(self.draft_model, self.target.n_vocab,
                                                  p_min=config.draft_p_min)
                self.drafter = (CombinedDrafter(model_drafter, NGramDrafter()) if config.ngram
                                else model_drafter)
            self.plain = SpeculativeEngine(self.target, None)
            self.spec = SpeculativeEngine(self.target, self.drafter)
        except BaseException:
            self.close()
            raise

    def reset(self) -> None:
        """Empty caches, so every run evaluates its prompt and generates from the same state."""
        self.target.reset()
        if self.draft_model is not None:
            self.draft_model.reset()

    def close(self) -> None:
        if self.draft_model is not None:
            self.draft_model.close()
        self.target.close()


def run_bench(config: BenchConfig, *, progress: BenchProgress | None = None) -> BenchResult:
    """Load the pair once, warm up, measure the verify-cost curve, then run every paired
    (temperature, k, prompt, repeat). Ctrl-C stops early: the result holds the completed pairs and
    `interrupted` is set."""
    config.validate()
    prompts = config.prompt_list()
    result = BenchResult(config=config, started_at=_now(), machine=machine_info())
    _phase(progress, "load", 1)
    loaded = _Loaded(config)
    try:
        _step(progress, Path(config.target).name)
        result.load_seconds = loaded.target_load + loaded.draft_load
        result.target = _model_info(loaded.target, loaded.target_load)
        if loaded.draft_model is not None:
            result.draft = _model_info(loaded.draft_model, loaded.draft_load)
        result.drafter = loaded.drafter.name if loaded.drafter else "plain"

        tokenized = [_tokenize(loaded.target, p.text) for p in prompts]
        result.prompts = [{"name": p.name, "kind": p.kind, "tokens": len(t), "text": p.text}
                          for p, t in zip(prompts, tokenized, strict=True)]
        need = max(len(t) for t in tokenized) + config.max_tokens + config.max_batch()
        if need > loaded.target.n_ctx:
            raise BenchError(f"the longest prompt ({max(len(t) for t in tokenized)} tokens) plus -n "
                             f"{config.max_tokens} and a draft batch needs a context of {need} tokens, "
                             f"but it is {loaded.target.n_ctx} (raise --ctx, or lower -n)")

        t0 = time.perf_counter()
        _phase(progress, "warm-up", 2)
        _warm_up(loaded, config, tokenized[0], progress)
        result.warmup_seconds = time.perf_counter() - t0

        t0 = time.perf_counter()
        # Measured at a typical context length: attention makes long contexts dearer per token.
        loaded.reset()
        prefix = curve_prefix(tokenized, config.max_tokens, loaded.target.n_ctx - config.max_batch())
        loaded.target.decode(prefix, outputs="none")
        if loaded.draft_model is not None:
            loaded.draft_model.decode(prefix, outputs="none")
        result.curve = measure_verify_curve(loaded.target, loaded.draft_model, config.max_batch(),
                                            config.curve_repeats, progress=progress)
        result.curve_seconds = time.perf_counter() - t0

        t0 = time.perf_counter()
        try:
            _run_pairs(loaded, config, prompts, tokenized, result, progress)
        except KeyboardInterrupt:
            result.interrupted = True
        result.runs_seconds = time.perf_counter() - t0
    finally:
        loaded.close()
    result.configs = aggregate(result.runs, config, result.curve)
    result.machine["load_average_end"] = load_average()
    result.finished_at = _now()
    return result


def _tokenize(model: Model, text: str) -> list[int]:
    return model.tokenize(text, add_special=True, parse_special=True)


def _warm_up(loaded: _Loaded, config: BenchConfig, prompt: list[int], progress: BenchProgress | None) -> None:
    """First decodes allocate buffers and build graphs; none of that belongs in the timings."""
    n = max(1, min(config.warmup_tokens, config.max_tokens))
    k = max((k for k in config.ks if k != AUTO), default=4)
    sampling = config.sampling(config.temps[-1])
    for engine, k_run in ((loaded.plain, 1), (loaded.spec, k)):
        loaded.reset()
        engine.generate(prompt, GenerationParams(max_tokens=n, sampling=sampling, seed=config.seed,
                                                 draft_max=k_run, ignore_eos=config.ignore_eos)).complete()
        _step(progress, "speculative" if engine is loaded.spec else "plain")


def curve_prefix(tokenized: list[list[int]], max_tokens: int, limit: int) -> list[int]:
    """A cache prefix as long as a typical verify sees: the median prompt plus half the generation,
    made of the prompts' own tokens (repeated if need be), at most `limit` tokens."""
    length = int(statistics.median(len(t) for t in tokenized)) + max_tokens // 2
    length = max(1, min(length, limit))
    pool = [t for tokens in tokenized for t in tokens]
    return (pool * (length // len(pool) + 1))[:length]


def measure_verify_curve(target: Model, draft: Model | None, max_m: int, repeats: int, *,
                         progress: BenchProgress | None = None) -> VerifyCurve:
    """Median wall time of a target decode of m = 1..max_m tokens with logits for every row (what a
    verify does), on top of the tokens already in the cache, which is rolled back after each decode.

    Each size is timed in a block of back-to-back decodes after one untimed decode: llama.cpp reuses
    its compute graph while the batch shape stays the same, as it does over a run at a fixed k.
    Passes alternately ascending and descending spread slow drift and bursts of load over the sizes."""
    if target.n_past + max_m > target.n_ctx:
        target.reset()
    prefix = target.n_past
    filler = (list(target.tokens[-max_m:]) + [target.vocab_info().bos] * max_m)[:max_m]
    sizes = list(range(1, max_m + 1))
    times: dict[int, list[float]] = {m: [] for m in sizes}
    passes = (sizes, sizes[::-1], sizes, sizes[::-1])
    per_pass = max(1, -(-repeats // len(passes)))
    _phase(progress, "verify cost", len(passes) * len(sizes) + (1 if draft is not None else 0))
    gc.collect()
    for order in passes:
        for m in order:
            times[m].extend(_time_decodes(target, filler[:m], "all", prefix, per_pass))
            _step(progress, f"m={m}")
    points = [VerifyPoint(m, 1000 * statistics.median(t), 1000 * min(t), 1000 * max(t), len(t))
              for m, t in times.items()]
    draft_ms = None
    if draft is not None:
        if draft.n_past + 1 > draft.n_ctx:
            draft.reset()
        # The drafter's steady state: one token at a time, logits for the last row only.
        samples = _time_decodes(draft, filler[:1], "last", draft.n_past, max(4, repeats))
        draft_ms = 1000 * statistics.median(samples)
        _step(progress, "draft")
    return VerifyCurve(points, prefix, draft_ms)


def _time_decodes(model: Model, tokens: list[int], outputs: str, keep: int, n: int) -> list[float]:
    """Seconds of each of at least n timed decodes (more for fast models, up to ~20 ms of samples, so
    a tiny model's sub-millisecond decodes are not at the mercy of a single scheduler hiccup)."""
    samples: list[float] = []
    spent = 0.0
    for i in range(1 + 200):
        t0 = time.perf_counter()
        model.decode(tokens, outputs=outputs)
        dt = time.perf_counter() - t0
        model.truncate(keep)
        if i == 0:
            continue  # builds the graph for this shape
        samples.append(dt)
        spent += dt
        if len(samples) >= n and spent >= 0.02:
            break
    return samples


def _pair_order(config: BenchConfig, pair: int) -> tuple[str, str]:
    if config.alternate_order and pair % 2 == 1:
        return ("spec", "plain")
    return ("plain", "spec")


def _run_pairs(loaded: _Loaded, config: BenchConfig, prompts: list[BenchPrompt], tokenized: list[list[int]],
               result: BenchResult, progress: BenchProgress | None) -> None:
    total = len(config.temps) * len(config.ks) * len(prompts) * config.repeat * 2
    _phase(progress, "runs", total)
    seq = 0
    for temp in config.temps:
        sampling = config.sampling(temp)
        for k in config.ks:
            pair = 0
            for pi, (prompt, tokens) in enumerate(zip(prompts, tokenized, strict=True)):
                for rep in range(config.repeat):
                    seed = config.seed + 1000 * pi + rep  # the same for both halves, and across configs
                    done: list[RunRecord] = []
                    outputs: dict[str, list[int]] = {}
                    for position, mode in enumerate(_pair_order(config, pair)):
                        engine = loaded.spec if mode == "spec" else loaded.plain
                        params = GenerationParams(max_tokens=config.max_tokens, sampling=sampling, seed=seed,
                                                  draft_max=k if mode == "spec" else 1,
                                                  ignore_eos=config.ignore_eos,
                                                  same_as_plain=config.same_as_plain)
                        loaded.reset()
                        stats, outputs[mode] = _timed_generation(engine, tokens, params)
                        done.append(_record(seq, temp, k, prompt.name, rep, pair, mode, position, seed,
                                            stats, outputs[mode], result.curve))
                        seq += 1
                        _step(progress, f"T={temp:g} k={k} {prompt.name} #{rep + 1} {mode}")
                    # Only whole pairs are kept, so an interrupted bench never holds half a pair.
                    plain = next(r for r in done if r.mode == "plain")
                    spec = next(r for r in done if r.mode == "spec")
                    if plain.tokens_per_second and spec.tokens_per_second:
                        spec.speedup = spec.tokens_per_second / plain.tokens_per_second
                    spec.first_fork = first_difference(outputs["plain"], outputs["spec"])
                    result.runs.extend(done)
                    pair += 1


def _timed_generation(engine: SpeculativeEngine, tokens: list[int],
                      params: GenerationParams) -> tuple[GenerationStats, list[int]]:
    # A collection in the middle of one run would land on one side of a pair only.
    gc.collect()
    gc.disable()
    generation = engine.generate(tokens, params)
    try:
        generation.complete()
    finally:
        gc.enable()
    return generation.stats, list(generation.tokens)


def _record(seq: int, temp: float, k: K, prompt: str, rep: int, pair: int, mode: str, position: int,
            seed: int, stats: GenerationStats, output: list[int], curve: VerifyCurve | None) -> RunRecord:
    gen = stats.generation_seconds
    other = max(0.0, gen - stats.draft_seconds - stats.verify_seconds)
    c_draft = stats.draft_seconds / stats.drafted if stats.drafted else None
    rec = RunRecord(
        seq=seq, temperature=temp, k=k, prompt=prompt, repeat=rep, pair=pair, mode=mode, position=position,
        seed=seed, n_prompt=stats.n_prompt, n_generated=stats.n_generated, generation_seconds=gen,
        prompt_seconds=stats.prompt_seconds, tokens_per_second=stats.tokens_per_second, rounds=stats.rounds,
        drafted=stats.drafted, accepted=stats.accepted, rejections=stats.rejections,
        acceptance_rate=stats.acceptance_rate, alpha=stats.alpha, tokens_per_round=stats.tokens_per_round,
        mean_accepted=stats.accepted / stats.drafting_rounds if stats.drafting_rounds else None,
        mean_k=stats.drafted / stats.rounds if stats.rounds else None,
        draft_seconds=stats.draft_seconds, verify_seconds=stats.verify_seconds, other_seconds=other,
        decode_seconds=stats.decode_seconds, stop_reason=stats.stop_reason,
        output_crc=zlib.crc32(np.asarray(output, dtype=np.int64).tobytes()),
        k_per_round=list(stats.k_per_round) if mode == "spec" else [],  # plain: all zeros
    )
    if mode == "spec" and curve is not None:
        rec.predicted_speedup = predicted_speedup(curve, stats.alpha, c_draft, stats.k_per_round)
    return rec


def predicted_speedup(curve: VerifyCurve, alpha: float | None, c_draft_s: float | None,
                      k_per_round: Sequence[int]) -> float | None:
    """Leviathan et al.'s prediction with the measured verify-cost curve:
    sum_rounds E(alpha, k) * T_v(1) / sum_rounds (k c_draft + T_v(k + 1)); a round with k = 0 yields
    one token for T_v(1). None when there are no rounds, or drafts but no acceptance measurement."""
    if not k_per_round:
        return None
    t1 = curve.ms(1) / 1000
    expected = cost = 0.0
    for k in k_per_round:
        if k == 0:
            expected += 1.0
            cost += t1
            continue
        if alpha is None or c_draft_s is None:
            return None
        expected += expected_tokens_per_round(alpha, k)
        cost += k * c_draft_s + curve.ms(k + 1) / 1000
    return expected * t1 / cost if cost > 0 else None


# -- aggregation ------------------------------------------------------------------------------------------


def aggregate(runs: list[RunRecord], config: BenchConfig, curve: VerifyCurve | None) -> list[ConfigResult]:
    """Per-(temperature, k) figures from complete pairs, in the order of the configuration."""
    out = []
    for temp in config.temps:
        for k in config.ks:
            rs = [r for r in runs if r.temperature == temp and r.k == k]
            if rs:
                out.append(_aggregate_one(temp, k, rs, config, curve))
    return out


def _pooled(spec: list[RunRecord], curve: VerifyCurve | None) -> dict:
    drafted = sum(r.drafted for r in spec)
    accepted = sum(r.accepted for r in spec)
    examined = accepted + sum(r.rejections for r in spec)
    rounds = sum(r.rounds for r in spec)
    drafting_rounds = sum(1 for r in spec for k in r.k_per_round if k)
    gen = sum(r.generation_seconds for r in spec)
    draft_s = sum(r.draft_seconds for r in spec)
    verify_s = sum(r.verify_seconds for r in spec)
    alpha = accepted / examined if examined else None
    c_draft = draft_s / drafted if drafted else None
    ks = [k for r in spec for k in r.k_per_round]
    return {
        "acceptance_rate": accepted / drafted if drafted else None,
        "alpha": alpha,
        "mean_accepted": accepted / drafting_rounds if drafting_rounds else None,
        "tokens_per_round": sum(r.n_generated for r in spec) / rounds if rounds else None,
        "mean_k": drafted / rounds if rounds else None,
        "c_draft_ms": None if c_draft is None else 1000 * c_draft,
        "draft_share": draft_s / gen if gen > 0 else None,
        "verify_share": verify_s / gen if gen > 0 else None,
        "other_share": max(0.0, 1 - (draft_s + verify_s) / gen) if gen > 0 else None,
        "predicted_speedup": predicted_speedup(curve, alpha, c_draft, ks) if curve else None,
    }


def _pairs(runs: list[RunRecord]) -> list[tuple[RunRecord, RunRecord]]:
    by_pair: dict[int, dict[str, RunRecord]] = {}
    for r in runs:
        by_pair.setdefault(r.pair, {})[r.mode] = r
    return [(d["plain"], d["spec"]) for _, d in sorted(by_pair.items()) if "plain" in d and "spec" in d]


def _aggregate_one(temp: float, k: K, runs: list[RunRecord], config: BenchConfig,
                   curve: VerifyCurve | None) -> ConfigResult:
    pairs = _pairs(runs)
    plain = [p for p, _ in pairs]
    spec = [s for _, s in pairs]
    ratios = [s.speedup for s in spec if s.speedup is not None]
    pooled = _pooled(spec, curve)
    plain_gen = sum(r.generation_seconds for r in plain)
    speedup = Spread.of(ratios)
    predicted = pooled.pop("predicted_speedup")
    per_prompt = []
    for name in dict.fromkeys(r.prompt for r in spec):
        pp = [(p, s) for p, s in pairs if s.prompt == name]
        sp = [s for _, s in pp]
        pooled_p = _pooled(sp, curve)
        per_prompt.append(PromptResult(
            prompt=name,
            plain_tps=Spread.of([p.tokens_per_second for p, _ in pp]),
            spec_tps=Spread.of([s.tokens_per_second for s in sp]),
            speedup=Spread.of([s.speedup for s in sp]),
            acceptance_rate=pooled_p["acceptance_rate"],
            tokens_per_round=pooled_p["tokens_per_round"],
            predicted_speedup=pooled_p["predicted_speedup"],
        ))
    must_agree = temp == 0 or config.same_as_plain
    forks = [s.first_fork for _, s in pairs if must_agree and s.first_fork is not None]
    return ConfigResult(
        temperature=temp, k=k, pairs=len(pairs),
        plain_tps=Spread.of([r.tokens_per_second for r in plain]),
        spec_tps=Spread.of([r.tokens_per_second for r in spec]),
        speedup=speedup,
        speedup_geomean=float(np.exp(np.mean(np.log(ratios)))) if ratios else None,
        wins=sum(1 for x in ratios if x > 1.0),
        plain_other_share=(max(0.0, 1 - sum(r.verify_seconds for r in plain) / plain_gen)
                           if plain_gen > 0 else None),
        predicted_speedup=predicted,
        efficiency=(speedup.median / predicted) if speedup.median is not None and predicted else None,
        mismatches=len(forks),
        first_forks=forks,
        short_runs=sum(1 for r in plain + spec if r.n_generated < config.max_tokens),
        per_prompt=per_prompt,
        **pooled,
    )


# -- metadata and files -----------------------------------------------------------------------------------


def machine_info() -> dict:
    from importlib import metadata

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        usable = os.cpu_count()
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "python": sys.version.split()[0],
        "llama_cpp_python": version("llama-cpp-python"),
        "numpy": version("numpy"),
        "specli": version("specli"),
        "load_average_start": load_average(),
    }


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none): other work competing for the CPU."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _model_info(model: Model, load_seconds: float) -> ModelInfo:
    try:
        size: int | None = model.path.stat().st_size
    except OSError:
        size = None
    return ModelInfo(path=str(model.path), file_bytes=size, description=model.description(),
                     n_params=model.n_params(), n_vocab=model.n_vocab, n_ctx=model.n_ctx,
                     n_threads=model.n_threads, load_seconds=load_seconds)


def write_json(result: BenchResult, path: str | Path) -> None:
    """Every figure, the metadata and each run's raw record, as one JSON document (written atomically:
    a reader never sees half of it)."""
    atomic_write_text(path, json.dumps(result.to_dict(), indent=2, ensure_ascii=False) + "\n")


CSV_FIELDS = [
    "seq", "temperature", "k", "prompt", "repeat", "pair", "mode", "position", "seed", "n_prompt",
    "n_generated", "generation_seconds", "prompt_seconds", "tokens_per_second", "speedup",
    "predicted_speedup",
    "rounds", "drafted", "accepted", "rejections", "acceptance_rate", "alpha", "tokens_per_round",
    "mean_accepted", "mean_k", "draft_seconds", "verify_seconds", "other_seconds", "decode_seconds",
    "stop_reason", "output_crc", "first_fork",
]
_CSV_META = ["target", "draft", "drafter", "max_tokens", "n_threads", "started_at"]


def write_csv(result: BenchResult, path: str | Path) -> None:
    """One row per run (both halves of every pair), with the run's configuration and a little
    metadata on each row, so the file stands alone in a spreadsheet."""
    meta = {
        "target": result.target.path if result.target else str(result.config.target),
        "draft": result.draft.path if result.draft else str(result.config.draft),
        "drafter": result.drafter,
        "max_tokens": result.config.max_tokens,
        "n_threads": result.target.n_threads if result.target else result.config.n_threads,
        "started_at": result.started_at,
    }
    f = io.StringIO(newline="")
    writer = csv.DictWriter(f, fieldnames=CSV_FIELDS + _CSV_META, extrasaction="ignore")
    writer.writeheader()
    for run in result.runs:
        row = _rounded(asdict(run))
        writer.writerow({**{k: ("" if row[k] is None else row[k]) for k in CSV_FIELDS}, **meta})
    atomic_write_text(path, f.getvalue())


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(x, nd)


def _rounded(obj: object) -> object:
    """Floats rounded for the files (timings carry no more than microseconds of meaning)."""
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _phase(progress: BenchProgress | None, name: str, total: int) -> None:
    if progress is not None:
        progress.phase(name, total)


def _step(progress: BenchProgress | None, detail: str = "") -> None:
    if progress is not None:
        progress.step(detail)


def bench_notes(result: BenchResult) -> list[tuple[str, str]]:
    """(level, message) caveats about how far to trust this result; level is "warn" or "info"."""
    notes: list[tuple[str, str]] = []
    m = result.machine
    usable = m.get("cpus_usable") or m.get("cpu_count") or 1
    threads = result.target.n_threads if result.target else None
    load = m.get("load_average_start")
    if result.interrupted:
        notes.append(("warn", f"interrupted: only the {len(result.runs) // 2} pairs completed are counted"))
    if load is not None and threads and load > usable - threads + 0.5:
        plural = "s" if threads != 1 else ""
        notes.append(("warn", f"the machine was busy (load average {load:g} on {usable} CPUs, bench uses "
                              f"{threads} thread{plural}): timings are noisy; pairing cancels slow drift, "
                              "not bursts"))
    if threads and threads > usable:
        notes.append(("warn", f"{threads} threads on {usable} usable CPUs: oversubscribed, "
                              "llama.cpp slows down"))
    mismatched = sum(c.mismatches for c in result.configs)
    if mismatched:
        forks = sorted(f for c in result.configs for f in c.first_forks)
        which = "greedy and same-as-plain" if result.config.same_as_plain else "greedy (T=0)"
        shown = ", ".join(str(f) for f in forks[:8]) + (" …" if len(forks) > 8 else "")
        notes.append(("warn", f"{mismatched} {which} pairs forked from their plain run (first differing "
                              f"token: {shown}): "
                              "this model's batched logits differ slightly from single-token ones (K-quants "
                              "do, F32/F16/Q8_0 do not; see the README), or a bug"))
    overhead = [c.plain_other_share for c in result.configs if c.plain_other_share is not None]
    if overhead and statistics.median(overhead) > 0.2:
        notes.append(("info", f"plain decoding spends {100 * statistics.median(overhead):.0f} % of its time "
                              "outside the target's decode (sampling, bookkeeping): the model is fast enough "
                              "for Python overheads to count, which the prediction leaves out"))
    short = sum(c.short_runs for c in result.configs)
    total = sum(2 * c.pairs for c in result.configs)
    if short:
        notes.append(("info", f"{short} of {total} runs stopped at end-of-text before -n "
                              f"{result.config.max_tokens} tokens; their rates come from fewer tokens"))
    few = [c for c in result.configs if 0 < c.pairs < 5]
    if few:
        notes.append(("info", f"{few[0].pairs} pairs per configuration: medians and spreads are rough "
                              "(raise --repeat or add prompts)"))
    return notes


def iter_pairs(result: BenchResult) -> Iterator[tuple[RunRecord, RunRecord]]:
    """(plain, spec) for every complete pair, in execution order."""
    for temp in result.config.temps:
        for k in result.config.ks:
            yield from _pairs([r for r in result.runs if r.temperature == temp and r.k == k])


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length if one is a prefix of
    the other), or None if they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
