"""The drafters specli knows, by name: what each needs, how it is built, how front ends describe and
colour it. `api.load`, models.toml's reserved names, `--draft`'s help, the terminal's and the web
page's colours all read this table; a new drafter is a new file and one entry here.

`--draft` takes a reserved name (`ngram`, `mtp`) or anything else, which names a draft model (a .gguf
path or a models.toml name). `--ngram` puts n-gram lookup in front of a draft model (combined).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # reading the table (models.toml's reserved names, --help) loads no llama.cpp
    from specli.drafters.base import Drafter
    from specli.llama import Model


@dataclass(frozen=True)
class BuildRequest:
    """What a drafter factory gets: the loaded target, and the draft model's file when it needs one."""

    target: Model
    draft_path: Path | None
    n_threads: int
    n_gpu_layers: int
    p_min: float
    ngram: bool  # with a draft model: n-gram lookup first (combined drafting)


@dataclass(frozen=True)
class Equivalents:
    """What other engines call this drafter, for `specli export` (None: the engine has none)."""

    llama_server: str  # --spec-type
    vllm: str | None  # --speculative-config's "method"
    sglang: str | None  # --speculative-algorithm


@dataclass(frozen=True)
class DrafterKind:
    name: str  # the source name its tokens carry (TokenEvent.drafter); for reserved kinds, --draft's value
    reserved: bool  # `--draft NAME` selects it (else a draft model is named by a path or models.toml name)
    needs: str  # "a draft model", "the target's MTP layers", "nothing"
    description: str  # one line, for --help and `specli models`
    colour: str  # accepted tokens of this source, in the terminal (rich style) and the web page
    build: Callable[[BuildRequest], Drafter]
    equivalents: Equivalents
    loads_target_mtp: bool = False  # the target is loaded with its MTP layers
    uses_model: bool = False  # a draft model file (`--draft PATH`), which --ngram may combine with lookup
    takes_p_min: bool = False  # --draft-p-min cuts its rounds (it reports its own confidence)
    in_bench: bool = True  # `specli bench` can run it


def _draft_model(req: BuildRequest) -> Drafter:
    from specli.compat import require_compatible
    from specli.drafters.combined import CombinedDrafter
    from specli.drafters.model import DraftModelDrafter
    from specli.drafters.ngram import NGramDrafter
    from specli.llama import Model, ModelOptions

    assert req.draft_path is not None
    target = req.target
    draft = Model(req.draft_path, ModelOptions(n_ctx=target.n_ctx, n_threads=req.n_threads,
                                               n_gpu_layers=req.n_gpu_layers,
                                               batch_invariant=target.options.batch_invariant))
    try:
        # A recurrent/hybrid draft goes back through a checkpoint of its state (Model.checkpoint).
        require_compatible(target, draft)
    except BaseException:
        draft.close()
        raise
    drafter = DraftModelDrafter(draft, target.n_vocab, p_min=req.p_min)
    return CombinedDrafter(drafter, NGramDrafter()) if req.ngram else drafter


def _ngram(req: BuildRequest) -> Drafter:
    from specli.drafters.ngram import NGramDrafter

    return NGramDrafter()


def _mtp(req: BuildRequest) -> Drafter:
    from specli.drafters.mtp import MTPDrafter, require_mtp

    require_mtp(req.target)
    return MTPDrafter(req.target, p_min=req.p_min)


DRAFTERS: dict[str, DrafterKind] = {k.name: k for k in (
    DrafterKind("draft", False, "a draft model", "a smaller model with the target's vocabulary drafts",
                "green", _draft_model, Equivalents("draft-simple", "draft_model", "STANDALONE"),
                uses_model=True, takes_p_min=True),
    DrafterKind("ngram", True, "nothing", "prompt lookup: continues repeats of the prompt and output",
                "magenta", _ngram, Equivalents("ngram-simple", "ngram", "NGRAM")),
    DrafterKind("mtp", True, "the target's MTP layers", "the target's own multi-token-prediction layers",
                "green", _mtp, Equivalents("draft-mtp", "mtp", "NEXTN"), loads_target_mtp=True,
                takes_p_min=True, in_bench=False),
)}
DRAFT_MODEL = DRAFTERS["draft"]
NGRAM_LOOKUP = DRAFTERS["ngram"]  # what --ngram puts in front of a draft model (combined drafting)
RESERVED_NAMES: tuple[str, ...] = tuple(k.name for k in DRAFTERS.values() if k.reserved)


def drafter_kind(draft: str | Path | None) -> DrafterKind | None:
    """What `--draft VALUE` selects: a reserved kind by name, a draft model otherwise; None: no draft."""
    if draft is None:
        return None
    return DRAFTERS.get(str(draft)) if str(draft) in RESERVED_NAMES else DRAFT_MODEL


def colour_of(source: str) -> str:
    """The colour of tokens a source drafted and the target accepted."""
    kind = DRAFTERS.get(source)
    return kind.colour if kind is not None else "green"


def draft_help() -> str:
    """--draft's help: a draft model or one of the reserved names, each with its description."""
    reserved = "; ".join(f"'{k.name}' ({k.description})" for k in DRAFTERS.values() if k.reserved)
    return f"Draft: a .gguf path or a models.toml name (a draft model), or {reserved}."
