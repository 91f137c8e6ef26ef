"""Running a bench: load the pair (through specli.api.load, as `specli run` does), warm up, measure
the target's verify-cost curve, then make the paired plain/speculative runs, timing each."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
import zlib
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import numpy as np

from specli.api import load
from specli.bench.aggregate import aggregate, aggregate_servers, first_difference
from specli.bench.prediction import VerifyCurve, VerifyPoint, predicted_speedup
from specli.bench.results import BenchResult, ModelInfo, RunRecord, ServerRunRecord
from specli.bench.server import complete, request_body
from specli.bench.suite import AUTO, BenchConfig, BenchError, BenchPrompt, K
from specli.drafters.base import Drafter
from specli.engine import GenerationParams, SpeculativeEngine
from specli.llama import Model
from specli.stats import GenerationStats, acceptance

# -- progress (the UI implements it; None: silent) ---------------------------------------------------------


class BenchProgress(Protocol):
    def phase(self, name: str, total: int) -> None:
        """A phase starts: 'load', 'warm-up', 'verify cost' or 'runs', with `total` steps."""

    def step(self, detail: str = "") -> None:
        """One step of the current phase is done. Called only between timed sections."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _phase(progress: BenchProgress | None, name: str, total: int) -> None:
    if progress is not None:
        progress.phase(name, total)


def _step(progress: BenchProgress | None, detail: str = "") -> None:
    if progress is not None:
        progress.step(detail)


# -- running ---------------------------------------------------------------------------------------------


class _LoadedPair:
    """The models and drafter, built by specli.api.load (so bench refuses and accepts exactly what
    `specli run` does), and the two engines over them: plain and speculative share one target."""

    def __init__(self, config: BenchConfig) -> None:
        s = config.settings
        self.speculator = load(config.target, config.draft, n_ctx=s.ctx, n_threads=s.threads,
                               n_gpu_layers=s.gpu_layers, draft_p_min=s.draft_p_min, ngram=config.ngram,
                               batch_invariant=s.batch_invariant)
        self.target: Model = self.speculator.target
        self.drafter: Drafter | None = self.speculator.drafter
        # The draft model under the drafter (None for n-gram lookup): bench times its decodes.
        self.draft_model: Model | None = next(iter(self.drafter.models), None) if self.drafter else None
        self.spec: SpeculativeEngine = self.speculator.engine
        self.plain = SpeculativeEngine(self.target, None)  # shares the target; engines close nothing

    def reset(self) -> None:
        """Empty caches, so every run evaluates its prompt and generates from the same state."""
        self.target.reset()
        if self.draft_model is not None:
            self.draft_model.reset()

    def close(self) -> None:
        self.speculator.close()


def run_bench(config: BenchConfig, *, progress: BenchProgress | None = None) -> BenchResult:
    """Load the pair once, warm up, measure the verify-cost curve, then run every paired
    (temperature, k, prompt, repeat). Ctrl-C stops early: the result holds the completed pairs and
    `interrupted` is set."""
    config.validate()
    prompts = config.prompt_list()
    result = BenchResult(config=config, started_at=_now(), machine=machine_info())
    if config.servers:
        # Before anything is loaded: a wrong URL or key fails in a second, not after the local warm-up.
        _warm_up_servers(config, prompts[0], progress)
    _phase(progress, "load", 1)
    loaded = _LoadedPair(config)
    try:
        _step(progress, Path(config.target).name)
        result.target = _model_info(loaded.target)
        if loaded.draft_model is not None:
            result.draft = _model_info(loaded.draft_model)
        result.load_seconds = sum(m.load_seconds for m in (result.target, result.draft) if m is not None)
        result.drafter = loaded.drafter.name if loaded.drafter else "plain"
        if loaded.drafter is not None:
            result.drafter_block = max((s.block for s in loaded.drafter.sources), default=0)
        if loaded.drafter is not None:
            result.k_capped = config.cap_ks(loaded.target.max_rollback)

        tokenized = [loaded.speculator.tokenize(p.text) for p in prompts]
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
        # -k auto prices drafts with the curve just measured rather than timing each batch size in its
        # first runs (which would make its figure depend on the k listed before it).
        loaded.spec.costs.prime_verify({p.m: p.ms / 1000 for p in result.curve.points}, len(prefix))

        t0 = time.perf_counter()
        try:
            _run_pairs(loaded, config, prompts, tokenized, result, progress)
        except KeyboardInterrupt:
            result.interrupted = True
        result.runs_seconds = time.perf_counter() - t0
    finally:
        loaded.close()
    result.configs = aggregate(result.runs, config, result.curve)
    result.server_configs = aggregate_servers(result.server_runs, config)
    result.machine["load_average_end"] = load_average()
    result.finished_at = _now()
    return result


def _warm_up(loaded: _LoadedPair, config: BenchConfig, prompt: list[int],
             progress: BenchProgress | None) -> None:
    """First decodes allocate buffers and build graphs; none of that belongs in the timings."""
    n = max(1, min(config.warmup_tokens, config.max_tokens))
    k = max((k for k in config.ks if k != AUTO), default=4)
    settings = replace(config.run_settings(config.temps[-1], k), max_tokens=n)
    for engine in (loaded.plain, loaded.spec):
        loaded.reset()
        engine.generate(prompt, GenerationParams.of(settings)).complete()
        _step(progress, "speculative" if engine is loaded.spec else "plain")


def _warm_up_servers(config: BenchConfig, prompt: BenchPrompt, progress: BenchProgress | None) -> None:
    """One short request to each server: it must answer (ServerError otherwise), and its first request's
    allocations do not land in a timed run."""
    _phase(progress, "servers", len(config.servers))
    settings = replace(config.run_settings(config.temps[-1], config.ks[0]), max_tokens=8)
    for server in config.servers:
        complete(server, request_body(prompt.text, settings, config.ks[0]))
        _step(progress, server.name)


def curve_prefix(tokenized: list[list[int]], max_tokens: int, limit: int) -> list[int]:
    """A cache prefix as long as a typical verify sees: the median prompt plus half the generation,
    made of the prompts' own tokens (repeated if need be), at most `limit` tokens."""
    length = int(statistics.median(len(t) for t in tokenized)) + max_tokens // 2
    length = max(1, min(length, limit))
    pool = [t for tokens in tokenized for t in tokens]
    return (pool * (length // len(pool) + 1))[:length]


def curve_sizes(max_m: int) -> list[int]:
    """The batch sizes a curve measures: each up to 17 (where CPU staircases have their steps), then
    every 8th, and max_m itself; sizes between are interpolated (costs.verify_curve)."""
    dense = list(range(1, min(max_m, 17) + 1))
    sparse = list(range(25, max_m, 8))
    return dense + sparse + ([max_m] if max_m > 17 and max_m not in sparse else [])


def measure_verify_curve(target: Model, draft: Model | None, max_m: int, repeats: int, *,
                         progress: BenchProgress | None = None) -> VerifyCurve:
    """Median wall time of a target decode of m tokens (`curve_sizes` up to max_m) with logits for every
    row (what a verify does), on top of the tokens already in the cache, which is rolled back after each
    decode.

    Each size is timed in a block of back-to-back decodes after one untimed decode: llama.cpp reuses
    its compute graph while the batch shape stays the same, as it does over a run at a fixed k.
    Passes alternately ascending and descending spread slow drift and bursts of load over the sizes."""
    if target.n_past + max_m > target.n_ctx:
        target.reset()
    prefix = target.n_past
    filler = (list(target.tokens[-max_m:]) + [target.vocab_info().bos] * max_m)[:max_m]
    sizes = curve_sizes(max_m)
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


def _run_pairs(loaded: _LoadedPair, config: BenchConfig, prompts: list[BenchPrompt],
               tokenized: list[list[int]], result: BenchResult, progress: BenchProgress | None) -> None:
    total = len(config.temps) * len(config.ks) * len(prompts) * config.repeat * (2 + len(config.servers))
    _phase(progress, "runs", total)
    seq = 0
    for temp in config.temps:
        for k in config.ks:
            settings = config.run_settings(temp, k)
            pair = 0
            for pi, (prompt, tokens) in enumerate(zip(prompts, tokenized, strict=True)):
                for rep in range(config.repeat):
                    # The same seed for both halves, and across configs.
                    params = GenerationParams.of(settings, seed_offset=1000 * pi + rep)
                    seed = params.seed
                    done: list[RunRecord] = []
                    outputs: dict[str, list[int]] = {}
                    for position, mode in enumerate(_pair_order(config, pair)):
                        engine = loaded.spec if mode == "spec" else loaded.plain
                        loaded.reset()
                        stats, outputs[mode] = _timed_generation(engine, tokens, params)
                        done.append(_record(seq, temp, k, prompt.name, rep, pair, mode, position, seed,
                                            stats, outputs[mode], result.curve))
                        seq += 1
                        if position == 0:
                            _step(progress, f"T={temp:g} k={k} {prompt.name} #{rep + 1} {mode}")
                    # Only whole pairs are kept, so an interrupted bench never holds half a pair; the
                    # pair is kept before its last step is reported, so a Ctrl-C there keeps it.
                    _keep_pair(done, outputs, result)
                    _step(progress, f"T={temp:g} k={k} {prompt.name} #{rep + 1} {done[-1].mode}")
                    plain = next(r for r in done if r.mode == "plain")
                    for server in config.servers:
                        # Right after the local pair, same prompt, seed and settings: drift hits all alike.
                        body = request_body(prompt.text, replace(settings, seed=seed), k)
                        response = complete(server, body)
                        result.server_runs.append(_server_record(seq, server.name, temp, k, prompt.name, rep,
                                                                 pair, seed, response, plain))
                        seq += 1
                        _step(progress, f"T={temp:g} k={k} {prompt.name} #{rep + 1} {server.name}")
                    pair += 1


def _server_record(seq: int, server: str, temp: float, k: K, prompt: str, rep: int, pair: int, seed: int,
                   response, plain: RunRecord) -> ServerRunRecord:
    drafted, accepted = response.drafted, response.accepted
    tps = response.tokens_per_second
    return ServerRunRecord(
        seq=seq, server=server, temperature=temp, k=k, prompt=prompt, repeat=rep, pair=pair, seed=seed,
        n_generated=response.n_generated, ttft_seconds=response.ttft_seconds,
        total_seconds=response.total_seconds, tokens_per_second=tps,
        server_tokens_per_second=response.server_tokens_per_second, drafted=drafted, accepted=accepted,
        acceptance_rate=acceptance(accepted, drafted),
        finish_reason=response.finish_reason, count_source=response.count_source,
        vs_plain=tps / plain.tokens_per_second if tps and plain.tokens_per_second else None,
    )


def _keep_pair(done: list[RunRecord], outputs: dict[str, list[int]], result: BenchResult) -> None:
    """Complete a pair's speculative record with its pair's figures and add both halves at once."""
    plain = next(r for r in done if r.mode == "plain")
    spec = next(r for r in done if r.mode == "spec")
    if plain.tokens_per_second and spec.tokens_per_second:
        spec.speedup = spec.tokens_per_second / plain.tokens_per_second
    spec.first_fork = first_difference(outputs["plain"], outputs["spec"])
    result.runs.extend(done)


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
        first_accepted=stats.first_accepted, later_examined=stats.later_examined,
    )
    if mode == "spec" and curve is not None:
        rec.predicted_speedup = predicted_speedup(curve, stats.a1, stats.a2, c_draft, stats.k_per_round)
    return rec


# -- metadata --------------------------------------------------------------------------------------------


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


def _model_info(model: Model) -> ModelInfo:
    try:
        size: int | None = model.path.stat().st_size
    except OSError:
        size = None
    return ModelInfo(path=str(model.path), file_bytes=size, description=model.description(),
                     n_params=model.n_params(), n_vocab=model.n_vocab, n_ctx=model.n_ctx,
                     n_threads=model.n_threads, load_seconds=model.load_seconds)
