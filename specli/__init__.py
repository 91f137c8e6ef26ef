"""specli: speculative decoding for local GGUF models over llama.cpp.

The public names are imported on first use (PEP 562), so that importing a light submodule (the console
script's launcher, which installs the signal handlers first) does not import numpy and llama.cpp."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specli.api import Speculator, load
    from specli.engine import Generation, GenerationParams, SpeculativeEngine
    from specli.events import DoneEvent, Origin, PromptEvent, RejectedEvent, RoundEvent, TokenEvent
    from specli.sampling import SamplingParams
    from specli.stats import GenerationStats

__version__ = "0.1.0"

_WHERE = {
    "Speculator": "api", "load": "api",
    "Generation": "engine", "GenerationParams": "engine", "SpeculativeEngine": "engine",
    "DoneEvent": "events", "Origin": "events", "PromptEvent": "events", "RejectedEvent": "events",
    "RoundEvent": "events", "TokenEvent": "events",
    "SamplingParams": "sampling",
    "GenerationStats": "stats",
}

__all__ = [
    "DoneEvent",
    "Generation",
    "GenerationParams",
    "GenerationStats",
    "Origin",
    "PromptEvent",
    "RejectedEvent",
    "RoundEvent",
    "SamplingParams",
    "SpeculativeEngine",
    "Speculator",
    "TokenEvent",
    "load",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'specli' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"specli.{module}"), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
