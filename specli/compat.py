"""Can this draft speak for this target? The vocabulary check made before any speculation.

Modelled on llama.cpp's draft compatibility check: same tokenizer type, same BOS/EOS handling,
vocabulary sizes within 128 of each other (padded embedding rows differ between sizes of one
family), and the same token texts, here on a deterministic sample of ids (all ids up to 10,000, then
every n-th) so the check costs milliseconds on a 150k vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specli.llama import Model

MAX_VOCAB_SIZE_DIFFERENCE = 128
_FULL_CHECK_UPTO = 10_000
_SAMPLED_IDS = 2_000
_VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}


@dataclass
class CompatReport:
    problems: list[str] = field(default_factory=list)
    facts: list[tuple[str, str, str]] = field(default_factory=list)  # (what, target, draft)
    checked_token_texts: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


class VocabMismatchError(ValueError):
    pass


def _sample_ids(n: int) -> range | list[int]:
    if n <= _FULL_CHECK_UPTO:
        return range(n)
    step = max(1, (n - _FULL_CHECK_UPTO) // _SAMPLED_IDS)
    return [*range(_FULL_CHECK_UPTO), *range(_FULL_CHECK_UPTO, n, step), n - 1]


def check_vocab(target: Model, draft: Model) -> CompatReport:
    """Compare the two vocabularies; the report lists every difference found."""
    report = CompatReport()
    vt, vd = target.vocab_info(), draft.vocab_info()

    def fact(what: str, a: object, b: object, problem: str | None) -> None:
        report.facts.append((what, str(a), str(b)))
        if problem:
            report.problems.append(problem)

    fact(
        "tokenizer",
        _VOCAB_TYPES.get(vt.vocab_type, vt.vocab_type),
        _VOCAB_TYPES.get(vd.vocab_type, vd.vocab_type),
        "tokenizer types differ" if vt.vocab_type != vd.vocab_type else None,
    )
    size_diff = abs(vt.n_tokens - vd.n_tokens)
    fact(
        "vocab size",
        vt.n_tokens,
        vd.n_tokens,
        f"vocabulary sizes differ by {size_diff} (more than {MAX_VOCAB_SIZE_DIFFERENCE})"
        if size_diff > MAX_VOCAB_SIZE_DIFFERENCE
        else None,
    )
    fact(
        "BOS",
        f"{vt.bos} (add: {vt.add_bos})",
        f"{vd.bos} (add: {vd.add_bos})",
        "BOS handling differs" if vt.add_bos != vd.add_bos or (vt.add_bos and vt.bos != vd.bos) else None,
    )
    fact("EOS", vt.eos, vd.eos, "EOS tokens differ" if vt.eos != vd.eos else None)
    if not report.problems and vt.n_tokens > vd.n_tokens:
        # Every token the target commits is fed to the draft model, and llama_decode rejects ids past
        # its vocabulary (mid-run, "llama_decode failed"). Padding rows (UNUSED tokens, as converters
        # pad e.g. Qwen's 7B vocabulary 128 beyond the 0.5B's) are tolerated, as llama.cpp does.
        real = [t for t in range(vd.n_tokens, vt.n_tokens) if not target.token_is_unused(t)]
        if real:
            report.problems.append(
                f"the target has {len(real)} token{'s' if len(real) > 1 else ''} the draft does not know "
                f"(ids {real[0]}..{real[-1]}, e.g. {target.token_text(real[0]).decode(errors='replace')!r}); "
                "the draft cannot read text containing them"
            )
    if not report.problems:
        n = min(vt.n_tokens, vd.n_tokens)
        ids = _sample_ids(n)
        for i in ids:
            a, b = target.token_text(i), draft.token_text(i)
            if a != b:
                report.problems.append(
                    f"token {i} is {a.decode(errors='replace')!r} in the target but "
                    f"{b.decode(errors='replace')!r} in the draft"
                )
                break
        report.checked_token_texts = len(ids)
    return report


def require_compatible(target: Model, draft: Model) -> CompatReport:
    report = check_vocab(target, draft)
    if not report.ok:
        raise VocabMismatchError(
            f"{draft.path.name} cannot draft for {target.path.name}: {report.problems[0]} "
            "(a draft must share the target's vocabulary; see `specli models check`)"
        )
    return report
