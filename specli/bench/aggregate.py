"""Runs -> figures: each configuration's paired speedups, pooled acceptance and predicted speedup,
the pairs whose outputs should agree but fork, and the caveats a reader of the result should know."""

from __future__ import annotations

import statistics

import numpy as np

from specli.bench.prediction import VerifyCurve, predicted_speedup
from specli.bench.results import (
    BenchResult,
    ConfigResult,
    PromptResult,
    RunRecord,
    ServerConfigResult,
    ServerRunRecord,
    Spread,
)
from specli.bench.suite import BenchConfig, K
from specli.stats import acceptance


def aggregate(runs: list[RunRecord], config: BenchConfig, curve: VerifyCurve | None) -> list[ConfigResult]:
    """Per-(temperature, k) figures from complete pairs, in the order of the configuration."""
    out = []
    for temp in config.temps:
        for k in config.ks:
            rs = [r for r in runs if r.temperature == temp and r.k == k]
            if rs:
                out.append(_aggregate_one(temp, k, rs, config, curve))
    return out


def aggregate_servers(runs: list[ServerRunRecord], config: BenchConfig) -> list[ServerConfigResult]:
    """Per server and (temperature, k): rates, time to first token, pooled drafting figures."""
    out = []
    for server in config.servers:
        for temp in config.temps:
            for k in config.ks:
                rs = [r for r in runs if r.server == server.name and r.temperature == temp and r.k == k]
                if not rs:
                    continue
                reported = [r for r in rs if r.drafted is not None]
                drafted = sum(r.drafted or 0 for r in reported) if reported else None
                accepted = sum(r.accepted or 0 for r in reported) if reported else None
                out.append(ServerConfigResult(
                    server=server.name, url=server.url, temperature=temp, k=k, runs=len(rs),
                    tokens_per_second=Spread.of([r.tokens_per_second for r in rs]),
                    server_tokens_per_second=Spread.of([r.server_tokens_per_second for r in rs]),
                    ttft_seconds=Spread.of([r.ttft_seconds for r in rs]),
                    vs_plain=Spread.of([r.vs_plain for r in rs]),
                    drafted=drafted, accepted=accepted,
                    acceptance_rate=acceptance(accepted, drafted),
                ))
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
    first = sum(r.first_accepted for r in spec)
    later = sum(r.later_examined for r in spec)
    a1 = first / drafting_rounds if drafting_rounds else None
    a2 = (accepted - first) / later if later else None
    c_draft = draft_s / drafted if drafted else None
    ks = [k for r in spec for k in r.k_per_round]
    return {
        "acceptance_rate": acceptance(accepted, drafted),
        "alpha": alpha,
        "mean_accepted": accepted / drafting_rounds if drafting_rounds else None,
        "tokens_per_round": sum(r.n_generated for r in spec) / rounds if rounds else None,
        "mean_k": drafted / rounds if rounds else None,
        "c_draft_ms": None if c_draft is None else 1000 * c_draft,
        "c_pass_ms": 1000 * draft_s / drafting_rounds if drafting_rounds else None,
        "draft_share": draft_s / gen if gen > 0 else None,
        "verify_share": verify_s / gen if gen > 0 else None,
        "other_share": max(0.0, 1 - (draft_s + verify_s) / gen) if gen > 0 else None,
        "predicted_speedup": predicted_speedup(curve, a1, a2, c_draft, ks) if curve else None,
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
    must_agree = temp == 0 or config.settings.same_as_plain
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


def bench_notes(result: BenchResult) -> list[tuple[str, str]]:
    """(level, message) caveats about how far to trust this result; level is "warn" or "info"."""
    notes: list[tuple[str, str]] = []
    m = result.machine
    usable = m.get("cpus_usable") or m.get("cpu_count") or 1
    threads = result.target.n_threads if result.target else None
    load = m.get("load_average_start")
    if result.interrupted:
        notes.append(("warn", f"interrupted: only the {len(result.runs) // 2} pairs completed are counted"))
    if result.k_capped:
        asked = ", ".join(str(k) for k in result.k_capped)
        limit = next(iter(result.k_capped.values()))
        notes.append(("info", f"-k {asked} ran as k = {limit}: the target's recurrent state rolls back at "
                              f"most {limit} positions, so no round drafts more"))
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
        which = "greedy and same-as-plain" if result.config.settings.same_as_plain else "greedy (T=0)"
        shown = ", ".join(str(f) for f in forks[:8]) + (" …" if len(forks) > 8 else "")
        notes.append(("warn", f"{mismatched} {which} pairs forked from their plain run (first differing "
                              f"token: {shown}): "
                              "this model's batched logits differ slightly from single-token ones (K-quants "
                              "do; F32/F16/Q8_0 mostly do not, on some CPUs they do: see "
                              "docs/exactness.md), or a bug"))
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
    if result.server_runs and len(result.config.ks) > 1:
        notes.append(("info", "each server request asks for its k (speculative.n_max), but a server may keep "
                              "the k it was started with: llama-server does (compare drafted counts)"))
    few = [c for c in result.configs if 0 < c.pairs < 5]
    if few:
        notes.append(("info", f"{few[0].pairs} pairs per configuration: medians and spreads are rough "
                              "(raise --repeat or add prompts)"))
    return notes


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length if one is a prefix of
    the other), or None if they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
