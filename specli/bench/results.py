"""The records a bench produces: one per run, one per (temperature, k) configuration and prompt,
and the whole bench with its metadata. Plain data; the JSON layout lives in specli.bench.files."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specli.bench.prediction import VerifyCurve
from specli.bench.suite import BenchConfig, K


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
    # Two-rate acceptance counts (costs.py): drafting rounds whose first draft passed, and the later
    # drafts judged; a1 = first_accepted / drafting rounds, a2 = (accepted - first_accepted) / later.
    first_accepted: int = 0
    later_examined: int = 0
    predicted_speedup: float | None = None  # spec only, from the verify-cost curve
    speedup: float | None = None  # spec only: this run's tok/s over its pair's plain tok/s
    # spec only: the index of the first token where its output differs from its pair's plain run
    # (None: the same tokens)
    first_fork: int | None = None


@dataclass
class ServerRunRecord:
    """One run on a running server (`bench --server`), made right after the local pair with the same
    prompt, seed and settings."""

    seq: int
    server: str
    temperature: float
    k: K  # requested (`speculative.n_max`); a server may keep the k it was started with
    prompt: str
    repeat: int
    pair: int  # the local pair it ran beside
    seed: int
    n_generated: int
    ttft_seconds: float | None
    total_seconds: float
    tokens_per_second: float | None  # client side: tokens after the first / time after the first chunk
    server_tokens_per_second: float | None  # the server's timings.predicted_per_second
    drafted: int | None  # timings.draft_n; None: not reported
    accepted: int | None
    acceptance_rate: float | None
    finish_reason: str | None
    count_source: str  # "timings" | "usage" | "chunks"
    vs_plain: float | None = None  # tokens_per_second over the pair's local plain run's


@dataclass
class ServerConfigResult:
    """One server's figures for one (temperature, k)."""

    server: str
    url: str
    temperature: float
    k: K
    runs: int
    tokens_per_second: Spread
    server_tokens_per_second: Spread
    ttft_seconds: Spread
    vs_plain: Spread  # paired: each run over the local plain run beside it
    drafted: int | None  # summed over the runs (None: the server reports no drafting figures)
    accepted: int | None
    acceptance_rate: float | None

    @property
    def label(self) -> str:
        return f"T={self.temperature:g} k={self.k}"


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
    c_pass_ms: float | None  # draft seconds per drafting round (a block drafter's pass), in the runs
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
    drafter_block: int = 0  # positions one pass of a block drafter proposes (0: one pass per position)
    prompts: list[dict] = field(default_factory=list)  # name, kind, tokens
    load_seconds: float = 0.0
    warmup_seconds: float = 0.0
    curve_seconds: float = 0.0
    runs_seconds: float = 0.0
    curve: VerifyCurve | None = None
    configs: list[ConfigResult] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    interrupted: bool = False
    server_runs: list[ServerRunRecord] = field(default_factory=list)
    server_configs: list[ServerConfigResult] = field(default_factory=list)
    k_capped: dict[int, int] = field(default_factory=dict)  # k asked -> k run (the target's rollback bound)

    @property
    def best(self) -> ConfigResult | None:
        """The configuration with the highest median paired speedup."""
        scored = [c for c in self.configs if c.speedup.median is not None]
        return max(scored, key=lambda c: c.speedup.median) if scored else None
