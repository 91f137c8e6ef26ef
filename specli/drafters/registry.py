"""The drafters specli knows, by name: what each needs, how it is built, how front ends describe and
colour it. `api.load`, models.toml's reserved names, `--draft`'s help, the terminal's and the web
page's colours all read this table; a new drafter is a new file and one entry here. A drafter's name
is its entry's alone: the entry's factory gives it to the drafter it builds, whose tokens carry it.

`--draft` takes a reserved name (`ngram`, `mtp`) or anything else, which names a draft model (a .gguf
path or a models.toml name). `--ngram` puts n-gram lookup in front of a draft model (combined).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # reading the table (models.toml's reserved names, --help) loads no llama.cpp
    from specli.drafters.base import Drafter
    from specli.llama import Model, ModelOptions


@dataclass(frozen=True)
class BuildRequest:
    """What a drafter factory gets: the loaded target, and the draft model's file when it needs one."""

    target: Model
    draft_path: Path | None
    n_threads: int
    n_gpu_layers: int
    p_min: float
    ngram: bool  # with a draft model: n-gram lookup first (combined drafting)

    def draft_options(self) -> ModelOptions:
        """How the draft's file is loaded: the target's context, threads and arithmetic."""
        from specli.llama import ModelOptions

        return ModelOptions(n_ctx=self.target.n_ctx, n_threads=self.n_threads, n_gpu_layers=self.n_gpu_layers,
                            batch_invariant=self.target.options.batch_invariant)


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
    factory: Callable[[DrafterKind, BuildRequest], Drafter]  # builds the drafter, named by its kind
    equivalents: Equivalents
    loads_target_mtp: bool = False  # the target is loaded with its MTP layers
    uses_model: bool = False  # a draft model file (`--draft PATH`), which --ngram may combine with lookup
    takes_p_min: bool = False  # --draft-p-min cuts its rounds (it reports its own confidence)
    in_bench: bool = True  # `specli bench` can run it

    def build(self, req: BuildRequest) -> Drafter:
        """This kind's drafter for `req`, named by this entry."""
        return self.factory(self, req)


# A draft model with n-gram lookup in front of it (--ngram): the combination's name (its tokens carry
# its parts' names).
COMBINED = "combined"


def _draft_model(kind: DrafterKind, req: BuildRequest) -> Drafter:
    from specli.compat import require_compatible
    from specli.drafters.combined import CombinedDrafter
    from specli.drafters.model import DraftModelDrafter
    from specli.drafters.ngram import NGramDrafter
    from specli.llama import Model

    assert req.draft_path is not None
    target = req.target
    draft = Model(req.draft_path, req.draft_options())
    try:
        # A recurrent/hybrid draft goes back through a checkpoint of its state (Model.checkpoint).
        require_compatible(target, draft)
    except BaseException:
        draft.close()
        raise
    drafter = DraftModelDrafter(draft, target.n_vocab, kind.name, p_min=req.p_min)
    return CombinedDrafter(drafter, NGramDrafter(NGRAM_LOOKUP.name), COMBINED) if req.ngram else drafter


def _trained_head(kind: DrafterKind, req: BuildRequest) -> Drafter:
    """A trained drafter (EAGLE-3, DFlash, DSpark, Gemma 4's assistant) beside the loaded target: checked
    against it (hidden size, layers, vocabulary; the caches an assistant reads), then the drafter its
    architecture runs."""
    from specli.drafters.assistant import AssistantDrafter
    from specli.drafters.dflash import BlockDrafter
    from specli.drafters.eagle3 import Eagle3Drafter
    from specli.heads import HeadModel, assistant_problems, head_problems

    assert req.draft_path is not None
    target = req.target
    head = HeadModel(req.draft_path, req.draft_options())
    try:
        assistant = head.facts.architecture == "gemma4-assistant"
        problems = (assistant_problems if assistant else head_problems)(target, head)
        if problems:
            raise ValueError(f"{req.draft_path.name} cannot draft for {target.path.name}: "
                             f"{'; '.join(problems)}")
        if assistant:
            return AssistantDrafter(target, head, kind.name, p_min=req.p_min)
        if head.facts.architecture == "eagle3":
            return Eagle3Drafter(target, head, kind.name, p_min=req.p_min)
        return BlockDrafter(target, head, kind.name, p_min=req.p_min)
    except BaseException:
        head.close()
        raise


def _ngram(kind: DrafterKind, req: BuildRequest) -> Drafter:
    from specli.drafters.ngram import NGramDrafter

    return NGramDrafter(kind.name)


def _mtp(kind: DrafterKind, req: BuildRequest) -> Drafter:
    from specli.drafters.mtp import MTPDrafter, require_mtp

    require_mtp(req.target)
    return MTPDrafter(req.target, kind.name, p_min=req.p_min)


DRAFTERS: dict[str, DrafterKind] = {k.name: k for k in (
    DrafterKind("draft", False, "a draft model", "a smaller model with the target's vocabulary drafts",
                "green", _draft_model, Equivalents("draft-simple", "draft_model", "STANDALONE"),
                uses_model=True, takes_p_min=True),
    DrafterKind("ngram", True, "nothing", "prompt lookup: continues repeats of the prompt and output",
                "magenta", _ngram, Equivalents("ngram-simple", "ngram", "NGRAM")),
    DrafterKind("mtp", True, "the target's MTP layers", "the target's own multi-token-prediction layers",
                "green", _mtp, Equivalents("draft-mtp", "mtp", "NEXTN"), loads_target_mtp=True,
                takes_p_min=True, in_bench=False),
    # Trained drafters: a GGUF whose architecture says what it is (--draft FILE selects them itself).
    DrafterKind("eagle3", False, "an EAGLE-3 head", "a trained one-layer head reading three target layers",
                "blue", _trained_head, Equivalents("draft-eagle3", "eagle3", "EAGLE3"), takes_p_min=True),
    DrafterKind("dflash", False, "a DFlash drafter", "a trained block drafter: a whole block in one pass",
                "bright_magenta", _trained_head, Equivalents("draft-dflash", "dflash", None),
                takes_p_min=True),
    DrafterKind("dspark", False, "a DSpark drafter",
                "a trained block drafter with a Markov head and a confidence head",
                "bright_blue", _trained_head, Equivalents("draft-dspark", None, None), takes_p_min=True),
    # DFlash2: llama.cpp runs it as DFlash (--spec-type draft-dflash), vLLM by the checkpoint's
    # architecture under the dflash method.
    DrafterKind("dflash2", False, "a DFlash2 drafter",
                "a trained block drafter that walks the best path through each position's top candidates",
                "dark_orange", _trained_head, Equivalents("draft-dflash", "dflash", None), takes_p_min=True),
    # Gemma 4's assistant: llama.cpp's draft-mtp with the file as -md, vLLM's mtp with it as the model.
    DrafterKind("assistant", False, "a Gemma 4 assistant",
                "a trained drafter that reads the target's KV cache and last hidden state",
                "bright_green", _trained_head, Equivalents("draft-mtp", "mtp", None), loads_target_mtp=True,
                takes_p_min=True),
)}
DRAFT_MODEL = DRAFTERS["draft"]
NGRAM_LOOKUP = DRAFTERS["ngram"]  # what --ngram puts in front of a draft model (combined drafting)
RESERVED_NAMES: tuple[str, ...] = tuple(k.name for k in DRAFTERS.values() if k.reserved)


def drafter_kind(draft: str | Path | None) -> DrafterKind | None:
    """What `--draft VALUE` selects: a reserved kind by name; a file, the kind its GGUF says it is (a
    trained head, or else a draft model); None: no draft."""
    if draft is None:
        return None
    if str(draft) in RESERVED_NAMES:
        return DRAFTERS[str(draft)]
    trained = trained_kind(draft)
    return DRAFTERS[trained] if trained else DRAFT_MODEL


def trained_kind(path: str | Path) -> str | None:
    """"eagle3", "dflash", "dspark", "dflash2" or "assistant" (Gemma 4's) when `path` is such a drafter's
    GGUF (its architecture, DSpark's Markov head and DFlash2's selector, as llama.cpp tells them apart),
    else None (a draft model, or no such file: loading says what is wrong with it)."""
    path = Path(path).expanduser()
    try:
        stat = path.stat()
    except OSError:
        return None
    return _trained_kind(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _trained_kind(path: str, size: int, mtime: int) -> str | None:
    from specli.gguf_info import GGUFError, read_gguf_info

    try:
        info = read_gguf_info(path)
    except (GGUFError, OSError, ValueError):
        return None
    if info.architecture == "eagle3":
        return "eagle3"
    if info.architecture == "gemma4-assistant":
        return "assistant"
    if info.architecture == "dflash":
        names = {t.name for t in info.all_tensors}
        # As llama.cpp tells them apart (src/models/dflash.cpp): DSpark's Markov head, DFlash2's selector.
        return "dspark" if "markov_w1.weight" in names else "dflash2" if "selector_hidden.weight" in names \
            else "dflash"
    return None


def colour_of(source: str) -> str:
    """The colour of tokens a source drafted and the target accepted: its entry's (every source is
    named by the entry that built it)."""
    return DRAFTERS[source].colour


def draft_help() -> str:
    """--draft's help: a draft model, the trained heads a file may be, or one of the reserved names,
    each with its description."""
    reserved = "; ".join(f"'{k.name}' ({k.description})" for k in DRAFTERS.values() if k.reserved)
    heads = ", ".join(k.needs for k in DRAFTERS.values() if not k.reserved and not k.uses_model)
    return (f"Draft: a .gguf path or a models.toml name (a draft model, or {heads}: the file says which), "
            f"or {reserved}.")
