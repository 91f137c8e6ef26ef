"""The importable API: load a target and a drafter, generate as a stream of events, read stats.

from specli import load, GenerationParams, SamplingParams

with load("target.gguf", draft="draft.gguf", n_ctx=2048) as spec:
    generation = spec.generate("Once upon a time", GenerationParams(max_tokens=64))
    for event in generation:
        if isinstance(event, TokenEvent):
            print(event.text, end="", flush=True)
    print(generation.stats.as_dict())
"""

from __future__ import annotations

from pathlib import Path

from specli.compat import CompatReport, require_compatible
from specli.drafters.base import Drafter
from specli.drafters.combined import CombinedDrafter
from specli.drafters.model import DraftModelDrafter
from specli.drafters.mtp import MTPDrafter
from specli.drafters.ngram import NGramDrafter
from specli.engine import Generation, GenerationParams, SpeculativeEngine
from specli.llama import Model, ModelOptions

NGRAM = "ngram"
MTP = "mtp"  # self-drafting from the target's multi-token-prediction (MTP / NextN) layers
# Architectures whose llama.cpp graph has an MTP (LLM_GRAPH_TYPE_DECODER_MTP) form, from the bundled
# src/models/*.cpp; on others an MTP context would run the trunk's graph over a cache without it.
MTP_ARCHITECTURES = frozenset({
    "bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm4moe",
    "glm5-next", "hy_v3", "mimo2", "nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next", "step35",
})


class Speculator:
    """A loaded target (and drafter): tokenizes prompts and runs generations on one engine."""

    def __init__(self, target: Model, drafter: Drafter | None, compat: CompatReport | None = None) -> None:
        self.target = target
        self.drafter = drafter
        self.compat = compat
        self.engine = SpeculativeEngine(target, drafter)

    def tokenize(self, prompt: str) -> list[int]:
        """The target's tokens for `prompt` (BOS added if the model wants it); the draft uses the same ids."""
        return self.target.tokenize(prompt, add_special=True, parse_special=True)

    def generate(self, prompt: str | list[int], params: GenerationParams | None = None) -> Generation:
        """A generation: iterate it for events; its text, tokens and stats are current after each."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else prompt
        return self.engine.generate(tokens, params or GenerationParams())

    def close(self) -> None:
        """Free the models this Speculator loaded (the drafter's, then the target)."""
        if self.drafter is not None:
            self.drafter.close()
        self.target.close()

    def __enter__(self) -> Speculator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(
    target: str | Path,
    draft: str | Path | None = None,
    *,
    n_ctx: int = 4096,
    n_threads: int = 0,
    n_gpu_layers: int = 0,
    draft_p_min: float = 0.0,
    ngram: bool = False,
) -> Speculator:
    """Load a target and optionally a drafter.

    draft: a GGUF path (a draft model), "ngram" (prompt lookup, no model), "mtp" (self-drafting from
    the target's own MTP layers; ValueError when its GGUF has none), or None (plain decoding).
    ngram=True with a draft model: combined drafting (n-gram matches first, the model otherwise).
    """
    # Without a drafter nothing rolls back: a recurrent target needs no state snapshots (each one is
    # a copy of the whole recurrent state, ~50 MB on a 9B Qwen3.5).
    mtp = draft is not None and str(draft) == MTP
    opts = ModelOptions(n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, load_mtp=mtp,
                        **({"max_rollback": 0} if draft is None else {}))
    target_model = Model(target, opts)
    drafter: Drafter | None = None
    compat = None
    try:
        if draft is not None and str(draft) == NGRAM:
            drafter = NGramDrafter()
        elif mtp:
            _require_mtp(target_model)
            drafter = MTPDrafter(target_model, p_min=draft_p_min)
        elif draft is not None:
            draft_model = Model(
                draft, ModelOptions(n_ctx=target_model.n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
            )
            try:
                # A recurrent/hybrid draft goes back through a checkpoint of its state (Model.checkpoint).
                compat = require_compatible(target_model, draft_model)
            except BaseException:
                draft_model.close()
                raise
            model_drafter = DraftModelDrafter(draft_model, target_model.n_vocab, p_min=draft_p_min)
            drafter = CombinedDrafter(model_drafter, NGramDrafter()) if ngram else model_drafter
        return Speculator(target_model, drafter, compat)
    except BaseException:
        if drafter is not None:
            drafter.close()
        target_model.close()
        raise


def _require_mtp(target: Model) -> None:
    """draft="mtp" on a GGUF without MTP layers: a clear error naming the way out."""
    if target.n_layer_nextn == 0:
        raise ValueError(
            f"{target.path.name} has no MTP (multi-token prediction) layers "
            f"({target.architecture}.nextn_predict_layers is 0), so it cannot draft for itself; "
            "use a draft model or --draft ngram"
        )
    if target.architecture not in MTP_ARCHITECTURES:
        raise ValueError(
            f"{target.path.name} has MTP layers, but the bundled llama.cpp runs MTP heads only for "
            f"{', '.join(sorted(MTP_ARCHITECTURES))}, not {target.architecture}; "
            "use a draft model or --draft ngram"
        )
