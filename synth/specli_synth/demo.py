"""The demo pair of ``specli demo-models``: a Qwen2-0.5B-shaped target (~25 ms/token on 2 CPU cores) and a
~12x cheaper draft, with a vocabulary and token statistics learned from the running Python's standard
library docstrings and comments. Building it takes about a minute on 2 quiet cores (72 s beside other
work, 2 min 20 s on a busy machine) and writes ~800 MB (BUILD_COST says so before it starts).
Deterministic for a given standard library.
"""

from __future__ import annotations

import inspect
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from specli_synth.gguf_writer import ProgressCallback, WeightDType
from specli_synth.ngram_model import SynthModelConfig, counted_factors, write_ngram_model
from specli_synth.vocab import train_vocab

_DOCSTRING_RE = re.compile(r'(?:^|[=(\s])[rRuU]?"""(.*?)"""', re.S)
_COMMENT_BLOCK_RE = re.compile(r"(?:^[ \t]*#[^\n]*\n)+", re.M)  # runs of whole-line comments
_CORPUS_SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "site-packages", "lib2to3", "tkinter", "turtledemo"}
)


def stdlib_docstrings(max_chars: int | None = 2_000_000, min_chars: int = 40) -> list[str]:
    """Prose from the running Python's standard library docstrings, in a deterministic (sorted-path) order.

    Triple-double-quoted strings and runs of whole-line comments are found with regular expressions
    (10x faster than ``ast``); only prose paragraphs are kept (no doctests, tables or
    indented code), each unwrapped onto one line. Collection stops after *max_chars* characters.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py") if not _CORPUS_SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])
    )
    documents: list[str] = []
    total = 0
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        docstrings = (inspect.cleandoc(m.group(1)) for m in _DOCSTRING_RE.finditer(source))
        comments = (_comment_text(m.group(0)) for m in _COMMENT_BLOCK_RE.finditer(source))
        for text in (*docstrings, *comments):
            doc = "\n\n".join(_unwrap(p) for p in text.split("\n\n") if _is_prose(p))
            if len(doc) < min_chars:
                continue
            documents.append(doc)
            total += len(doc)
            if max_chars is not None and total >= max_chars:
                return documents
    return documents


def _is_prose(paragraph: str) -> bool:
    if (
        not paragraph.strip()
        or paragraph[0].isspace()
        or any(m in paragraph for m in (">>>", "|", "==", "--", "::"))
    ):
        return False
    letters = sum(c.isalpha() or c == " " for c in paragraph)
    return letters >= 0.85 * len(paragraph)


def _comment_text(block: str) -> str:
    return "\n".join(line.strip().lstrip("#").strip() for line in block.splitlines())


def _unwrap(paragraph: str) -> str:
    return " ".join(line.strip() for line in paragraph.splitlines())


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo pair.

    The default target has Qwen2-0.5B's transformer shape (896 wide, 24 layers, 14 query / 2 KV heads,
    FFN 4864; a smaller 8k vocabulary) and f16 weights: ~370M parameters, ~25 ms/token on 2 CPU cores.
    The draft (512 wide, 6 layers) is ~15x cheaper per token (~2 ms) and, by default, distilled: its
    factors are the target's truncated, so it agrees with the target only partly. Both copy from their
    context (an induction head, see SynthModelConfig.induction), the draft with narrower match codes.
    """

    n_vocab: int = 8192
    corpus_chars: int = 2_000_000
    n_ctx_train: int = 4096
    dtype: WeightDType = "f16"
    target: SynthModelConfig = SynthModelConfig(
        n_embd=896,
        n_layer=24,
        n_head=14,
        n_head_kv=2,
        n_ff=4864,
        rank=448,
        skip_rank=128,
        seen_dims=64,
        seen_penalty=10.0,
        sharpness=1.2,
        noise_gain=0.002,
        induction=4.0,
        induction_single=4.0,
        induction_dims=16,
        rope_theta=1e6,  # as Qwen2: the match lanes' RoPE pairs hardly rotate over the context
        seed=11,
        name="specli-demo-target",
    )
    draft: SynthModelConfig = SynthModelConfig(
        n_embd=512,
        n_layer=6,
        n_head=8,
        n_head_kv=2,
        n_ff=1408,
        rank=280,
        skip_rank=64,
        seen_dims=32,
        seen_penalty=7.0,
        sharpness=1.2,
        noise_gain=0.003,
        induction=4.0,
        induction_single=4.0,
        induction_dims=10,
        rope_theta=1e6,
        seed=12,
        name="specli-demo-draft",
    )
    distill_draft: bool = True  # draft = the target's factors truncated to the draft's ranks


DEMO_TARGET_FILE = "specli-demo-target.gguf"
DEMO_DRAFT_FILE = "specli-demo-draft.gguf"
# What the default build costs, for a user to read before it starts (2-core AMD EPYC, 2026-11-27:
# 72 s and 796 MB with other work beside it; most of the time is factoring the target's statistics).
BUILD_COST = "about 800 MB on disk and 1-2 minutes on 2 cores, once"


def build_demo_pair(
    directory: str | Path, *, progress: ProgressCallback | None = None, config: DemoConfig | None = None
) -> tuple[Path, Path]:
    """Write the demo target and draft (one shared vocabulary) into *directory*; returns their paths.

    The vocabulary and the token statistics come from the standard library's docstrings and comments,
    so the models write docstring-flavoured English. With the default :class:`DemoConfig`: about a
    minute and ~0.7 GB of RAM on 2 cores, files of ~750 MB (target) and ~50 MB (draft). *progress* receives
    ``(stage, overall fraction)`` with the fraction growing from 0 to 1. Files are written under a
    temporary name and renamed when complete, so an interrupted build leaves no truncated model.
    """
    config = config or DemoConfig()
    directory = Path(directory)

    def stage_reporter(start: float, end: float) -> ProgressCallback:
        def report(stage: str, fraction: float) -> None:
            if progress is not None:
                progress(stage, start + (end - start) * min(max(fraction, 0.0), 1.0))

        return report

    # rough shares of the build time on 2 cores, so that the reported fraction grows evenly
    stage_reporter(0.0, 0.05)("reading standard library docstrings", 0.0)
    documents = stdlib_docstrings(config.corpus_chars)
    if sum(map(len, documents)) < 50_000:
        stdlib = sysconfig.get_paths()["stdlib"]
        raise RuntimeError(f"too little text in the standard library under {stdlib} to build the demo")
    stage_reporter(0.05, 0.12)("learning the vocabulary", 0.0)
    trained = train_vocab(documents, config.n_vocab)
    target, draft = config.target, config.draft
    factors = None
    if config.distill_draft:
        stage_reporter(0.12, 0.45)(f"counting and factoring {target.name}", 0.0)
        factors = counted_factors(trained.documents, trained, target)
    paths = [
        write_ngram_model(
            directory / filename,
            trained,
            model,
            factors=factors,
            dtype=config.dtype,
            n_ctx_train=config.n_ctx_train,
            progress=stage_reporter(start, end),
        )
        for model, filename, start, end in (
            (target, DEMO_TARGET_FILE, 0.45, 0.95),
            (draft, DEMO_DRAFT_FILE, 0.95, 1.0),
        )
    ]
    if progress is not None:
        progress("done", 1.0)
    return paths[0], paths[1]
