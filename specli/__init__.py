"""specli: speculative decoding for local GGUF models over llama.cpp."""

from specli.api import Speculator, load
from specli.engine import Generation, GenerationParams, SpeculativeEngine
from specli.events import DoneEvent, Origin, PromptEvent, RejectedEvent, RoundEvent, TokenEvent
from specli.sampling import SamplingParams
from specli.stats import GenerationStats
from specli.verify import speculative_step

__version__ = "0.1.0"

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
    "speculative_step",
]
