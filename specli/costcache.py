"""What decodes cost on this machine, remembered from one process to the next.

`-k auto` prices every draft with the target's verify cost by batch size and the drafter's step
(costs.CostModel), which it measures as it goes. A new process knew none of it and spent its first
rounds timing batch sizes: fresh `specli run` processes with the costs of earlier ones against none
(Gemma 3 270M, n-gram lookup, T 0, 256 tokens) ran repetitive text 1.19x, code 1.07x, a copy-edit
1.01x as fast. So the cost model is kept in a small JSON file per machine, pair of models and thread
count, read when a Speculator is built and written when it closes. With the costs goes a draft model's
acceptance by confidence, per sampling regime (policy.Learned): it describes the pair of models, and
a fresh process that took each confidence at its face value drafted 0-1 tokens in its first ~10
rounds (a 150k-vocabulary pair at T 1: auto / k=3 0.916 without it, 0.958 with it, fresh processes).
n-gram lookup's describes the text and is learned anew.

What is kept describes the machine when it is quiet: a decode during which the process got less than
costs.STARVED of its threads' CPU time (other work took the cores) is not written, and a restored cost
only prices a batch size until the new process measures it (costs.CostModel.restore).

SPECLI_COST_CACHE=0 turns it off; SPECLI_CACHE_DIR moves it (default $XDG_CACHE_HOME/specli, or
~/.cache/specli). A missing, unreadable or malformed file is the same as none: nothing here raises.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

from specli.costs import STARVED, CostModel
from specli.drafters.base import Drafter
from specli.fileio import cache_base, switched_off
from specli.host import cpuinfo
from specli.llama import Model, repacks
from specli.policy import Learned
from specli.settings import usable_cores

FORMAT = 2  # 2: verify samples are (seconds, position) pairs


def cache_directory() -> Path | None:
    """Where cost files live, or None when SPECLI_COST_CACHE=0 turns them off."""
    if switched_off("SPECLI_COST_CACHE"):
        return None
    return cache_base() / "costs"


def identity(target: Model, drafter: Drafter | None) -> dict:
    """What the costs depend on: the machine, llama.cpp, the model files and how they were loaded.
    (Not the context size: a verify's cost depends on the positions in use, not on n_ctx.)"""
    import llama_cpp

    def file(path: Path) -> list:
        try:
            stat = path.stat()
            return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]
        except OSError:
            return [str(path), None, None]

    def model(m: Model) -> dict:
        return {"file": file(m.path), "threads": m.n_threads, "gpu_layers": m.options.n_gpu_layers,
                "repack": repacks(m.options), "batch_invariant": m.options.batch_invariant}

    about: dict = {
        "format": FORMAT,
        "machine": [platform.machine(), cpuinfo("model name") or platform.processor(), os.cpu_count()],
        "llama_cpp": getattr(llama_cpp, "__version__", None),
        "target": model(target),
        "drafter": None if drafter is None else {"name": drafter.name,
                                                  "models": [model(m) for m in drafter.models]},
    }
    if drafter is not None and drafter.head_files:
        # A trained head is no Model of its own (it runs beside the target): its file still tells
        # one head's costs and calibration from another's.
        about["drafter"]["heads"] = [file(path) for path in drafter.head_files]
    return about


def cache_path(about: dict) -> Path | None:
    """The cost file of a pair with this `identity`, or None when the cache is off."""
    directory = cache_directory()
    if directory is None:
        return None
    key = json.dumps(about, sort_keys=True)
    return directory / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def kept_share(about: dict | None) -> float | None:
    """The least CPU share (CPU seconds over wall seconds) a decode must have had to be kept: STARVED
    of the threads the target runs on this machine's cores (below it, other work took them); None (all
    kept) for an offloaded target, whose decodes wait on the GPU, or an unknown one."""
    target = (about or {}).get("target") or {}
    threads = target.get("threads")
    if not isinstance(threads, int) or threads < 1 or target.get("gpu_layers"):
        return None
    return STARVED * min(threads, usable_cores())


def restore(costs: CostModel, path: Path | None, learned: Learned | None = None) -> bool:
    """Load the costs (and into `learned`, the draft's calibrations) an earlier process saved at
    `path`; False if there were none (or none usable: a damaged file is ignored, and overwritten at
    the next save)."""
    if path is None:
        return False
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            return False
        costs.restore(record["costs"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return False
    if learned is not None:
        try:
            learned.restore(record.get("learned", {}))
        except (ValueError, TypeError, KeyError, AttributeError):
            pass  # the costs are good; the calibration is learned anew
    return True


def save(
    costs: CostModel, path: Path | None, about: dict | None = None, learned: Learned | None = None
) -> bool:
    """Write `costs` (and `learned`'s calibrations of the draft) to `path` (atomically: a reader never
    sees half a file); False if it could not."""
    if path is None or not (costs.verify or costs.carried):
        return False
    record = {"format": FORMAT, "identity": about, "costs": costs.to_record(kept_share(about))}
    if learned is not None:
        record["learned"] = learned.to_record()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(record))
        os.replace(partial, path)
    except OSError:
        return False
    return True
