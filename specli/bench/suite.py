"""What a bench runs: its configuration, the built-in prompt suite, a --prompts file, the -k and
--temp lists, and the checks that refuse what cannot work before anything is loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from specli.errors import UsageProblem
from specli.options import MAX_DRAFT_K, temperature_problem
from specli.policy import AutoK
from specli.sampling import DEFAULT_SAMPLING, SamplingParams

AUTO = "auto"

K = int | str  # a fixed draft length, or "auto"


class BenchError(UsageProblem, ValueError):
    """A bench option or input that cannot work (bad k list, unreadable prompts file ...)."""


class PromptFileError(BenchError):
    """The --prompts file cannot be read or holds no prompts."""


# -- prompts ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPrompt:
    name: str
    text: str
    kind: str = "custom"  # the regime it stands for (code, copy, story, chat) or "custom"


_CODE = '''import math


def mean_and_stdev(values: list[float]) -> tuple[float, float]:
    """Return the mean and the sample standard deviation of values."""
    if len(values) < 2:
        raise ValueError("need at least two values")
    mean = sum(values) / len(values)
    variance = sum((x - mean) ** 2 for x in values) / (len(values) - 1)
    return mean, math.sqrt(variance)


def median(values: list[float]) -> float:
    """Return the median of values."""
'''

_TYPO_TEXT = (
    "The old lighthouse stood at the edge of the cliff for more then two hundred years. Every night its "
    "keeper climbed the narow stairs, lit the great lamp and watched the ships pass safely throught the "
    "dark water. When the storms came, the light never failed, and the people of the vilage said that as "
    "long as the lighthouse was burning, no sailor would be lost at sea."
)

_CHAT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat are three simple ways to sleep better? Explain each in a sentence or two."
    "<|im_end|>\n<|im_start|>assistant\n"
)

BUILTIN_PROMPTS: tuple[BenchPrompt, ...] = (
    BenchPrompt("code", _CODE, "code"),
    BenchPrompt(
        "copy-edit",
        "Fix the spelling mistakes in the following paragraph and write out the whole corrected "
        f"paragraph.\n\nParagraph: {_TYPO_TEXT}\n\nCorrected paragraph:",
        "copy",
    ),
    BenchPrompt(
        "story",
        "Once upon a time, in a small village at the edge of a great forest, there lived a girl who",
        "story",
    ),
    BenchPrompt("chat", _CHAT, "chat"),
)


def parse_prompts(text: str, source: str = "<prompts>") -> list[BenchPrompt]:
    """Prompts from a file's text: JSONL objects {"name": ..., "prompt": ...} if the first non-blank
    line is such an object, else one prompt per line. Blank lines are skipped."""
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise PromptFileError(f"{source}: no prompts (the file is empty)")
    prompts: list[BenchPrompt] = []
    if _json_object(lines[0][1]) is not None:
        for lineno, line in lines:
            obj = _json_object(line)
            if obj is None or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
                raise PromptFileError(
                    f'{source}:{lineno}: expected a JSON object with a non-empty "prompt" string '
                    "(the file is read as JSONL because its first line is a JSON object)"
                )
            name = obj.get("name")
            prompts.append(BenchPrompt(str(name) if name not in (None, "") else f"prompt-{len(prompts) + 1}",
                                       obj["prompt"], str(obj.get("kind", "custom"))))
    else:
        prompts = [BenchPrompt(f"line-{lineno}", line) for lineno, line in lines]
    return _unique_names(prompts)


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    """Read a --prompts file (see parse_prompts); PromptFileError with a one-line reason otherwise."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PromptFileError(f"cannot read prompts file {path}: it is not UTF-8 text") from None
    except OSError as e:
        raise PromptFileError(f"cannot read prompts file {path}: {e.strerror or e}") from None
    return parse_prompts(text, str(path))


def _json_object(line: str) -> dict | None:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _unique_names(prompts: list[BenchPrompt]) -> list[BenchPrompt]:
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        n = seen.get(p.name, 0) + 1
        seen[p.name] = n
        out.append(p if n == 1 else BenchPrompt(f"{p.name}-{n}", p.text, p.kind))
    return out


# -- options ----------------------------------------------------------------------------------------------


def parse_k_list(value: str) -> list[K]:
    """'1,2,4,auto' -> [1, 2, 4, 'auto'] (each k in 1..MAX_DRAFT_K, no duplicates)."""
    out: list[K] = []
    for item in (s.strip() for s in value.split(",")):
        if not item:
            continue
        if item == AUTO:
            k: K = AUTO
        else:
            try:
                k = int(item)
            except ValueError:
                raise BenchError(f"-k: {item!r} is not a whole number or 'auto'") from None
            if not 1 <= k <= MAX_DRAFT_K:
                raise BenchError(
                    f"-k: {k} is out of range 1..{MAX_DRAFT_K} (k = 0 is the plain baseline, always run)"
                )
        if k not in out:
            out.append(k)
    if not out:
        raise BenchError("-k: give at least one draft length, e.g. 1,2,4,8 or auto")
    return out


def parse_temp_list(value: str) -> list[float]:
    """'0,0.7,1' -> [0.0, 0.7, 1.0] (each >= 0, no duplicates)."""
    out: list[float] = []
    for item in (s.strip() for s in value.split(",")):
        if not item:
            continue
        try:
            t = float(item)
        except ValueError:
            raise BenchError(f"--temp: {item!r} is not a number") from None
        if (why := temperature_problem(t)) is not None:
            raise BenchError(f"--temp: {item} is not a temperature: it {why}")
        if t not in out:
            out.append(t)
    if not out:
        raise BenchError("--temp: give at least one temperature, e.g. 0,0.7,1.0")
    return out


@dataclass
class BenchConfig:
    target: str | Path
    draft: str | Path  # a GGUF path, or "ngram" (prompt lookup, no model)
    ks: list[K] = field(default_factory=lambda: [1, 2, 4, 8])
    temps: list[float] = field(default_factory=lambda: [0.0, 0.7, 1.0])
    prompts: list[BenchPrompt] | None = None  # None: BUILTIN_PROMPTS
    max_tokens: int = 128
    repeat: int = 3
    n_ctx: int = 2048
    n_threads: int = 0  # 0: llama.default_threads()
    n_gpu_layers: int = 0
    seed: int = 0
    same_as_plain: bool = True  # drafts verified against the target's own keyed draw (see sampling)
    top_k: int = DEFAULT_SAMPLING.top_k  # the filters of `specli run`, so bench measures what run does
    top_p: float = DEFAULT_SAMPLING.top_p
    min_p: float = DEFAULT_SAMPLING.min_p
    draft_p_min: float = 0.0
    ngram: bool = False  # with a draft model: combined drafting (n-gram matches first)
    # As llama-bench: every run generates exactly max_tokens, so plain and speculative runs compare
    # the same amount of work even at T > 0, where they stop at different places.
    ignore_eos: bool = True
    warmup_tokens: int = 16
    curve_repeats: int = 8  # timed decodes per batch size (at least) for the verify-cost curve
    # Alternate which half of a pair runs first (plain-spec, spec-plain, ...), so that whatever the
    # first run of a pair does to the second (cache, clocks) does not favour one side.
    alternate_order: bool = True

    def prompt_list(self) -> list[BenchPrompt]:
        return list(self.prompts) if self.prompts is not None else list(BUILTIN_PROMPTS)

    def validate(self) -> None:
        if not self.ks:
            raise BenchError("no draft lengths to bench (-k)")
        for k in self.ks:
            if k != AUTO and not (isinstance(k, int) and 1 <= k <= MAX_DRAFT_K):
                raise BenchError(f"-k: {k!r} is not a draft length in 1..{MAX_DRAFT_K} or 'auto'")
        if not self.temps or any(not t >= 0 for t in self.temps):
            raise BenchError("--temp: need one or more temperatures >= 0")
        if self.max_tokens < 1:
            raise BenchError("-n must be at least 1")
        if self.repeat < 1:
            raise BenchError("--repeat must be at least 1")
        if not self.prompt_list():
            raise BenchError("no prompts to bench")
        if self.curve_repeats < 1:
            raise BenchError("curve_repeats must be at least 1")
        SamplingParams(temperature=1.0, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)  # validates

    def max_batch(self) -> int:
        """The largest verify batch the runs can make: max k + 1 (auto may reach AutoK's k_max)."""
        return max(AutoK().k_max if k == AUTO else int(k) for k in self.ks) + 1

    def sampling(self, temperature: float) -> SamplingParams:
        return SamplingParams(temperature=temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)
