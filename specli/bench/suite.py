"""What a bench runs: its configuration, the built-in prompt suite, a --prompts file, the -k and
--temp lists, and the checks that refuse what cannot work before anything is loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specli.sampling import SamplingParams
from specli.settings import (
    AUTO,
    MAX_DRAFT_K,
    RunSettings,
    SettingError,
    Source,
    UsageProblem,
    defaults_for,
    parse_value,
)

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


# A prompts file is prompts: more than this is a device that never ends (/dev/zero) or the wrong file.
MAX_PROMPTS_BYTES = 64 * 2**20


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    """Read a --prompts file (see parse_prompts); PromptFileError with a one-line reason otherwise. A pipe
    (/dev/stdin) is read to its end, at most MAX_PROMPTS_BYTES."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROMPTS_BYTES + 1)
        if len(data) > MAX_PROMPTS_BYTES:
            raise PromptFileError(f"prompts file {path} is larger than {MAX_PROMPTS_BYTES >> 20} MiB: "
                                  "is it the right file?")
        text = data.decode("utf-8")
    except IsADirectoryError:
        raise PromptFileError(f"cannot read prompts file {path}: it is a directory") from None
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


_LIST = Source(text=True, spellings={"draft_max": "-k", "temp": "--temp"})


def _checked(name: str, item: Any, source: Source = _LIST) -> Any:
    """One value of bench's -k or --temp list, by the setting's own rule (and, for -k, not 0)."""
    try:
        parsed = parse_value(name, item, source)
    except SettingError as e:
        raise BenchError(f"{e.option}: {item!r} {e.problem.split(', got ')[0]}") from None
    if name == "draft_max" and parsed == 0:
        raise BenchError(f"-k: 0 is out of range 1..{MAX_DRAFT_K} (k = 0 is the plain baseline, always run)")
    return parsed


def _parse_list(name: str, value: str, example: str) -> list:
    """A comma-separated list of one setting's values, each checked by the setting's own rule."""
    out: list = []
    for item in (s.strip() for s in value.split(",")):
        if not item:
            continue
        parsed = _checked(name, item)
        if parsed not in out:
            out.append(parsed)
    if not out:
        raise BenchError(f"{_LIST.spell(name)}: give at least one value, e.g. {example}")
    return out


def parse_k_list(value: str) -> list[K]:
    """'1,2,4,auto' -> [1, 2, 4, 'auto'] (each k in 1..MAX_DRAFT_K, no duplicates)."""
    return _parse_list("draft_max", value, "1,2,4,8 or auto")


def parse_temp_list(value: str) -> list[float]:
    """'0,0.7,1' -> [0.0, 0.7, 1.0] (each a temperature, as --temp takes it; no duplicates)."""
    return _parse_list("temp", value, "0,0.7,1.0")


@dataclass
class BenchConfig:
    target: str | Path
    draft: str | Path  # a GGUF path, or "ngram" (prompt lookup, no model)
    ks: list[K] = field(default_factory=lambda: [1, 2, 4, 8])
    temps: list[float] = field(default_factory=lambda: [0.0, 0.7, 1.0])
    prompts: list[BenchPrompt] | None = None  # None: BUILTIN_PROMPTS
    repeat: int = 3
    # Everything a run shares with `specli run` (sampling filters, -n, context, threads, seed of the
    # first pair, same-as-plain, ignore-eos: as llama-bench, every run generates exactly -n tokens, so
    # plain and speculative runs compare the same amount of work even at T > 0).
    settings: RunSettings = field(default_factory=lambda: defaults_for("bench"))
    ngram: bool = False  # with a draft model: combined drafting (n-gram matches first)
    warmup_tokens: int = 16
    curve_repeats: int = 8  # timed decodes per batch size (at least) for the verify-cost curve
    # Alternate which half of a pair runs first (plain-spec, spec-plain, ...), so that whatever the
    # first run of a pair does to the second (cache, clocks) does not favour one side.
    alternate_order: bool = True
    # Running OpenAI-compatible servers (bench.server.ServerTarget) to run beside the local pairs.
    servers: list = field(default_factory=list)
    # The deepest draft the target can roll back (a recurrent/hybrid model's state snapshots), set by
    # run_bench once the target is loaded; None: no bound below MAX_DRAFT_K.
    k_limit: int | None = None

    @property
    def max_tokens(self) -> int:
        return self.settings.max_tokens

    def prompt_list(self) -> list[BenchPrompt]:
        return list(self.prompts) if self.prompts is not None else list(BUILTIN_PROMPTS)

    def validate(self) -> None:
        if not self.ks:
            raise BenchError("no draft lengths to bench (-k)")
        if not self.temps:
            raise BenchError("no temperatures to bench (--temp)")
        # Built in code (the API) rather than parsed: the same rules as the flags.
        typed = Source(text=False, spellings=_LIST.spellings)
        for k in self.ks:
            _checked("draft_max", k, typed)
        for t in self.temps:
            _checked("temp", t, typed)
        if self.repeat < 1:
            raise BenchError("--repeat must be at least 1")
        if not self.prompt_list():
            raise BenchError("no prompts to bench")
        if self.curve_repeats < 1:
            raise BenchError("curve_repeats must be at least 1")
        try:
            self.settings.validate()
        except SettingError as e:
            raise BenchError(str(e)) from None
        if self.settings.seed is None:
            self.settings = self.settings.seeded()

    def max_batch(self) -> int:
        """The largest verify batch the runs can make: max k + 1 (auto may draft up to MAX_DRAFT_K), no
        more than the target can roll back."""
        deepest = max(MAX_DRAFT_K if k == AUTO else int(k) for k in self.ks)
        return min(deepest, self.k_limit if self.k_limit is not None else deepest) + 1

    def cap_ks(self, limit: int) -> dict[int, int]:
        """Cap the draft lengths at what the target can roll back (the engine drafts no more): each k is
        labelled and predicted with the k its runs use. Returns {k asked: k used} for those capped."""
        capped = {k: limit for k in self.ks if k != AUTO and int(k) > limit}
        if limit < MAX_DRAFT_K:
            self.k_limit = limit
        if capped:
            self.ks = list(dict.fromkeys(k if k == AUTO else min(int(k), limit) for k in self.ks))
        return capped

    def run_settings(self, temperature: float, k: K) -> RunSettings:
        """The settings of one run of the bench: a temperature and a draft length."""
        return replace(self.settings, temp=temperature, draft_max=k)

    def sampling(self, temperature: float) -> SamplingParams:
        return SamplingParams.of(replace(self.settings, temp=temperature))
