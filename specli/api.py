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

from specli import costcache
from specli.drafters.base import Drafter
from specli.drafters.registry import DRAFTERS, BuildRequest, drafter_kind, trained_kind
from specli.engine import Generation, GenerationParams, SpeculativeEngine
from specli.llama import Model, ModelOptions
from specli.settings import DEFAULTS


class Speculator:
    """A loaded target (and drafter): tokenizes prompts and runs generations on one engine."""

    def __init__(self, target: Model, drafter: Drafter | None) -> None:
        self.target = target
        self.drafter = drafter
        self.engine = SpeculativeEngine(target, drafter)
        # What decodes cost here, as an earlier process over the same files measured it (costcache):
        # auto starts from it instead of timing every batch size anew.
        self._cost_identity = costcache.identity(target, drafter) if drafter is not None else None
        self.cost_file = costcache.cache_path(self._cost_identity) if self._cost_identity else None
        costcache.restore(self.engine.costs, self.cost_file, self.engine.learned)

    def tokenize(self, prompt: str) -> list[int]:
        """The target's tokens for `prompt` (BOS added if the model wants it); the draft uses the same ids."""
        return self.target.tokenize(prompt, add_special=True, parse_special=True)

    def generate(self, prompt: str | list[int], params: GenerationParams | None = None) -> Generation:
        """A generation: iterate it for events; its text, tokens and stats are current after each."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else prompt
        return self.engine.generate(tokens, params or GenerationParams())

    def abort(self) -> None:
        """Stop the running generation's decodes, from another thread: its iteration raises
        llama.DecodeAborted within one graph node, and so does every generation until `resume()`."""
        for model in self._models():
            model.abort()

    def resume(self) -> None:
        for model in self._models():
            model.resume()

    def _models(self) -> list[Model]:
        return [self.target, *(self.drafter.models if self.drafter is not None else ())]

    def close(self) -> None:
        """Free the models this Speculator loaded (the drafter's, then the target), after saving what
        decodes cost for the next process (costcache)."""
        if self.cost_file is not None:
            costcache.save(self.engine.costs, self.cost_file, self._cost_identity, self.engine.learned)
            self.cost_file = None
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
    n_ctx: int = DEFAULTS.ctx,
    n_threads: int = DEFAULTS.threads,
    n_gpu_layers: int = DEFAULTS.gpu_layers,
    draft_p_min: float = DEFAULTS.draft_p_min,
    ngram: bool = False,
    batch_invariant: bool = DEFAULTS.batch_invariant,
) -> Speculator:
    """Load a target and optionally a drafter (the defaults are specli.settings').

    draft: a GGUF path (a draft model), "ngram" (prompt lookup, no model), "mtp" (self-drafting from
    the target's own MTP layers; ValueError when its GGUF has none), or None (plain decoding); the
    names are specli.drafters.registry's. ngram=True with a draft model: combined drafting (n-gram
    matches first, the model otherwise). batch_invariant: arithmetic that gives a token the same logits
    in any batch (specli.llama), so speculation prints plain decoding's tokens on any quantization.
    """
    trained = trained_kind(target)
    if trained is not None:  # llama.cpp cannot create a context of one without its target's
        raise ValueError(f"{Path(target).name} is a trained drafter ({DRAFTERS[trained].needs}), which "
                         "drafts for a target and does not run alone: give it as --draft beside the model it "
                         "was trained for")
    kind = drafter_kind(draft)
    # Without a drafter nothing rolls back: a recurrent target needs no state snapshots (each one is
    # a copy of the whole recurrent state, ~50 MB on a 9B Qwen3.5).
    opts = ModelOptions(n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                        batch_invariant=batch_invariant, load_mtp=kind is not None and kind.loads_target_mtp,
                        **({"max_rollback": 0} if kind is None else {}))
    target_model = Model(target, opts)
    drafter: Drafter | None = None
    try:
        if kind is not None:
            drafter = kind.build(BuildRequest(
                target_model, None if kind.reserved else Path(draft), n_threads, n_gpu_layers,  # type: ignore[arg-type]
                draft_p_min, ngram,
            ))
        return Speculator(target_model, drafter)
    except BaseException:
        if drafter is not None:
            drafter.close()
        target_model.close()
        raise
