"""A bench on disk: every figure as one JSON document, one CSV row per run; both written atomically."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path

from specli.bench.results import BenchResult
from specli.fileio import atomic_write_text

BENCH_FORMAT = 1  # bumped when the JSON layout changes incompatibly


def json_document(result: BenchResult) -> dict:
    """The JSON layout of a bench (format BENCH_FORMAT)."""
    cfg = result.config
    s = cfg.settings
    best = result.best
    return {
        "format": BENCH_FORMAT,
        "tool": "specli bench",
        "started_at": result.started_at,
        "finished_at": result.finished_at,
        "interrupted": result.interrupted,
        "machine": result.machine,
        "models": {
            "target": asdict(result.target) if result.target else None,
            "draft": asdict(result.draft) if result.draft else None,
            "drafter": result.drafter,
            "drafter_block": result.drafter_block,
        },
        "options": {
            "ks": cfg.ks, "ks_capped": {str(k): v for k, v in result.k_capped.items()},
            "temperatures": cfg.temps, "max_tokens": s.max_tokens, "repeat": cfg.repeat,
            "n_ctx": s.ctx, "n_threads": result.target.n_threads if result.target else s.threads,
            "n_gpu_layers": s.gpu_layers, "seed": s.seed, "top_k": s.top_k, "top_p": s.top_p,
            "min_p": s.min_p, "draft_p_min": s.draft_p_min, "ngram": cfg.ngram,
            "same_as_plain": s.same_as_plain, "ignore_eos": s.ignore_eos,
            "warmup_tokens": cfg.warmup_tokens, "curve_repeats": cfg.curve_repeats,
            "alternate_order": cfg.alternate_order,
        },
        "prompts": result.prompts,
        "timings": {
            "load_seconds": _r(result.load_seconds), "warmup_seconds": _r(result.warmup_seconds),
            "verify_curve_seconds": _r(result.curve_seconds), "runs_seconds": _r(result.runs_seconds),
        },
        "verify_curve": None if result.curve is None else {
            "prefix_tokens": result.curve.prefix_tokens,
            "draft_ms_per_token": _r(result.curve.draft_ms_per_token),
            "points": [{**asdict(p), "ratio": _r(result.curve.ratio(p.m))} for p in result.curve.points],
        },
        "best": None if best is None else {"temperature": best.temperature, "k": best.k,
                                           "speedup": _r(best.speedup.median)},
        "configs": [_rounded(asdict(c)) for c in result.configs],
        "runs": [_rounded(asdict(r)) for r in result.runs],
        # `--server`: the servers, their figures per configuration, and each request (empty without)
        "servers": [{"name": s.name, "url": s.url} for s in cfg.servers],
        "server_configs": [_rounded(asdict(c)) for c in result.server_configs],
        "server_runs": [_rounded(asdict(r)) for r in result.server_runs],
    }


def write_json(result: BenchResult, path: str | Path) -> None:
    """Every figure, the metadata and each run's raw record, as one JSON document (written atomically:
    a reader never sees half of it)."""
    atomic_write_text(path, json.dumps(json_document(result), indent=2, ensure_ascii=False) + "\n")


CSV_FIELDS = [
    "seq", "temperature", "k", "prompt", "repeat", "pair", "mode", "position", "seed", "n_prompt",
    "n_generated", "generation_seconds", "prompt_seconds", "tokens_per_second", "speedup",
    "predicted_speedup",
    "rounds", "drafted", "accepted", "rejections", "acceptance_rate", "alpha", "tokens_per_round",
    "mean_accepted", "mean_k", "draft_seconds", "verify_seconds", "other_seconds", "decode_seconds",
    "stop_reason", "output_crc", "first_fork",
    # `--server` rows (mode "server"): which server, its time to first token and its own rate
    "server", "ttft_seconds", "server_tokens_per_second",
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
        "n_threads": result.target.n_threads if result.target else result.config.settings.threads,
        "started_at": result.started_at,
    }
    f = io.StringIO(newline="")
    writer = csv.DictWriter(f, fieldnames=CSV_FIELDS + _CSV_META, extrasaction="ignore")
    writer.writeheader()
    rows = [_rounded(asdict(run)) for run in result.runs]
    rows += [{**_rounded(asdict(run)), "mode": "server", "stop_reason": run.finish_reason}
             for run in result.server_runs]
    rows.sort(key=lambda r: r["seq"])
    for row in rows:
        writer.writerow({**{k: ("" if row.get(k) is None else row[k]) for k in CSV_FIELDS}, **meta})
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
