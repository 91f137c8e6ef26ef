"""Every setting of a run, a chat, a bench or a server, with its default and its range, written once.

`SETTINGS` is the table: a row per setting (its default, its range, its help, its flags and the commands
that take them, its models.toml key, its request field). Everything else reads it: `RunSettings` and
`DEFAULTS` (the defaults as a record), the engine's `GenerationParams`, `SamplingParams`, `ModelOptions`
and `api.load` (their field defaults), each command's options (specli.flags), models.toml's keys and a
request's fields. A new setting is one row.

Values come from several sources, each a partial update checked by the same rules: the command's
built-in defaults < models.toml's [defaults] < the model's own table < command-line flags (< chat's
slash commands, or a request's fields). `parse_updates` checks one source's values and `RunSettings.merged`
applies them; a wrong value raises `SettingError`, which names the option as the user typed it there
(`--temp`, `models.toml:3: defaults.temp`, `/temp`, `temperature`). Front ends turn it into their own
error (the CLI: exit 2).

This module is at the bottom of the package: it imports nothing of specli's, so that every layer above
(sampling, the engine, the front ends) can take its defaults from here.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any


class UsageProblem(Exception):
    """The user asked for something that cannot work (a bad option value, an empty prompt ...)."""


class SettingError(UsageProblem):
    """A setting's value is wrong. `option` is the setting as the user typed it (`--temp`, `/k`,
    `defaults.temp` with the file and line, a request's `temperature`)."""

    def __init__(
        self, option: str, problem: str, *, file: str | None = None, line: int | None = None
    ) -> None:
        self.option, self.problem, self.file, self.line = option, problem, file, line
        if file is not None:
            where = f"{file}:{line}" if line else file
            super().__init__(f"{where}: {option}: {problem}")
        else:
            super().__init__(f"{option} {problem}")

    @property
    def key(self) -> str:
        return self.option


MIN_CONTEXT = 16
# llama.cpp holds n_ctx in a uint32 and pads it up to a multiple of CONTEXT_PADDING (src/llama-context.cpp).
CONTEXT_PADDING = 256
MAX_CONTEXT = 2**32 - CONTEXT_PADDING
MAX_SEED = 2**32 - 1
RANDOM_SEED = -1  # llama.cpp's `-s -1`: a random seed (LLAMA_DEFAULT_SEED)
MAX_DRAFT_K = 64
# ggml's thread pool holds at most GGML_MAX_N_THREADS (512) threads; beyond it llama.cpp crashes (-t 70000:
# SIGSEGV). Far below that, threads that outnumber the cores only add synchronisation: on 2 busy cores
# one Gemma 3 270M token took 28 ms at -t 1, 97 ms at -t 16, 245 ms at -t 64 and 1.5 s at -t 512
# (lab/thread_count.py), so a run refuses more than THREADS_PER_CORE per core it may use.
MAX_THREADS = 512
THREADS_PER_CORE = 8
MAX_INT32 = 2**31 - 1
AUTO = "auto"
# Below this a temperature is greedy in all but name, and 1/T (with logits of a few tens) heads for
# float32 overflow: 1e-40 gave infinite logits and "no mass". llama.cpp has no lower bound of its own.
MIN_TEMPERATURE = 1e-4
MAX_TOP_K = MAX_INT32  # llama.cpp's top_k is an int32_t
# Where a generation's filters run (--sampling-on): in llama.cpp's graph, on the host, or chosen.
SAMPLING_ON = (AUTO, "backend", "host")
# Where `specli serve` listens, and where `specli export`'s commands listen: loopback (nothing outside this
# machine reaches the model unless asked) on llama-server's port.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def thread_limit() -> int:
    """The most threads a run may ask for on this machine (see THREADS_PER_CORE)."""
    return min(MAX_THREADS, THREADS_PER_CORE * usable_cores())


def random_seed() -> int:
    """A random seed for keyed noise (0 .. MAX_SEED, what `--seed` takes): the one place specli draws
    one (RunSettings.seeded, for a run without --seed; the engine, for an API caller's GenerationParams
    without)."""
    return secrets.randbelow(MAX_SEED + 1)


@dataclass(frozen=True)
class Range:
    """What a sampler setting may be: the check and how to say it. The one statement of these rules:
    sampling.SamplingParams checks its fields with them, and SETTINGS every flag, models.toml key and
    request field of the same settings."""

    valid: Callable[[float], bool]
    expected: str


def temperature_problem(t: float) -> str | None:
    """A temperature in range that is still unusable (None: fine)."""
    if 0 < t < MIN_TEMPERATURE:
        return (f"must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {t:g}: a smaller temperature "
                "is greedy in all but name and overflows the arithmetic")
    return None


# Keyed by SamplingParams' field names.
SAMPLER_RANGES: dict[str, Range] = {
    "temperature": Range(lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0 (0 is greedy)"),
    "top_k": Range(lambda v: 0 <= v <= MAX_TOP_K, "a whole number >= 0 (0: off)"),
    "top_p": Range(lambda v: 0 < v <= 1, "a number in (0, 1] (1: off)"),
    "min_p": Range(lambda v: 0 <= v <= 1, "a number in [0, 1] (0: off)"),
}

# The commands whose options are settings (specli.flags puts each row's flag on those in its `commands`).
RUN, BENCH, CHAT, SERVE, EXPORT, DEMO = "run", "bench", "chat", "serve", "export", "demo"
LOADING = (RUN, BENCH, CHAT, SERVE, EXPORT)  # every command that runs (or exports) a pair of models
GENERATING = (RUN, CHAT, SERVE, EXPORT)  # ... but bench, which compares lists of k and temperatures


@dataclass(frozen=True)
class Setting:
    """One setting: its name (the field, the models.toml key), its default, its flag, the kind of value,
    what a valid value is (`expected`, for messages), the check, the help text, and the commands that
    take its flag."""

    name: str
    default: Any
    flag: str
    kind: str  # "int" | "float" | "bool" | "k" | "seed" | "stops" | "choice" (one of `choices`)
    expected: str
    valid: Callable[[Any], bool]
    help: str
    commands: tuple[str, ...]
    short: str = ""  # its one-letter (or llama.cpp-style) flag: -n, -k, -s ...
    # A further check with its own message (None: fine); runs after `valid`.
    problem: Callable[[Any], str | None] | None = None
    # Its field in an OpenAI-style request (`specli serve`; llama-server's names where OpenAI has none),
    # None: not settable per request (it shapes the loaded models).
    request: str | None = None
    choices: tuple[str, ...] = ()  # kind "choice": its values
    off: Any = None  # a filter's value that turns it off (SamplingParams' defaults: the plain sampler)
    negation: str = ""  # a bool's flag that says false (--no-same-as-plain), where it has one
    # A command's own wording of the help, or its own negation flag (bench: --stop-at-eos).
    help_for: Mapping[str, str] = field(default_factory=dict)
    negation_for: Mapping[str, str] = field(default_factory=dict)


def _sampler(name: str) -> tuple[str, Callable[[Any], bool]]:
    """A sampler setting's rule (SAMPLER_RANGES, the one statement of it): expected, valid."""
    rule = SAMPLER_RANGES[name]
    return rule.expected, rule.valid


# In the order of the commands' --help and of messages that list settings. Defaults: llama.cpp's sampler
# (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8) and context, `-k auto`, same-as-plain,
# batch-invariant arithmetic.
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("temp", 0.8, "--temp", "float", *_sampler("temperature"), "Temperature; 0 is greedy.",
            (*GENERATING, DEMO), problem=temperature_problem, request="temperature"),
    Setting("top_k", 40, "--top-k", "int", *_sampler("top_k"), "Keep the k most likely tokens (0: off).",
            LOADING, request="top_k", off=0),
    Setting("top_p", 0.95, "--top-p", "float", *_sampler("top_p"),
            "Nucleus sampling mass, in (0, 1] (1: off).", LOADING, request="top_p", off=1.0),
    Setting("min_p", 0.05, "--min-p", "float", *_sampler("min_p"),
            "Drop tokens below P × the top probability (0: off).", LOADING, request="min_p", off=0.0),
    Setting("draft_max", AUTO, "--draft-max", "k", f'a whole number from 0 to {MAX_DRAFT_K}, or "auto"',
            lambda v: v == AUTO or 0 <= v <= MAX_DRAFT_K,
            f"Tokens drafted per round (0..{MAX_DRAFT_K}), or 'auto': chosen from measured costs and "
            "draft confidence.", (*GENERATING, DEMO), short="-k", request="speculative.n_max",
            help_for={DEMO: "Tokens drafted per round, or 'auto' (the synthetic pair: 3, so the colours "
                            "show)."}),
    Setting("draft_p_min", 0.0, "--draft-p-min", "float", "a number in [0, 1]", lambda v: 0 <= v <= 1,
            "Stop drafting in a round when the draft's top probability falls below P.", LOADING,
            request="speculative.p_min"),
    Setting("max_tokens", 256, "--max-tokens", "int", "a whole number >= 1",
            lambda v: 1 <= v <= MAX_INT32, "Tokens to generate at most.", (RUN, BENCH, CHAT, SERVE, DEMO),
            short="-n", request="max_tokens",
            help_for={BENCH: "Tokens per run.", CHAT: "Tokens per reply at most.",
                      SERVE: "Tokens per reply at most, unless a request says."}),
    Setting("seed", None, "--seed", "seed", f"a whole number from 0 to {MAX_SEED}, or -1 for a random seed",
            lambda v: v is None or 0 <= v <= MAX_SEED,
            "Random seed (-1: random; the one used is in --json).", LOADING, short="-s", request="seed",
            help_for={BENCH: "Seed of the first pair (pairs share a seed; -1: random).",
                      CHAT: "Random seed of the first reply (reply i uses seed + i; -1: random).",
                      SERVE: "Seed of every request that gives none (-1: random)."}),
    Setting("stop", (), "--stop", "stops", "a non-empty text", lambda v: True,
            "Stop when this text appears (repeatable).", (RUN, SERVE), request="stop"),
    Setting("same_as_plain", True, "--same-as-plain", "bool", "true or false", lambda v: True,
            "Accept a draft token only where it equals the target's own draw, so a seeded run prints "
            "exactly what --no-draft prints (default). --no-same-as-plain: the classic rejection rule, "
            "higher acceptance with a draft model, same distribution, but not plain's tokens.",
            LOADING, request="same_as_plain", negation="--no-same-as-plain"),
    Setting("ignore_eos", False, "--ignore-eos", "bool", "true or false", lambda v: True,
            "Never stop at end-of-text: generate -n tokens.", (RUN, BENCH, SERVE, EXPORT),
            request="ignore_eos",
            help_for={BENCH: "Generate exactly -n tokens per run, as llama-bench (default), or stop at "
                             "end-of-text."},
            negation_for={BENCH: "--stop-at-eos"}),
    Setting("batch_invariant", True, "--batch-invariant", "bool", "true or false", lambda v: True,
            "Arithmetic that gives a token the same logits in any batch (default), so a seeded run prints "
            "the same text every time and speculation prints --no-draft's tokens on any quantization. "
            "--no-batch-invariant: llama.cpp's fastest CPU kernels, whose rounding depends on the batch "
            "(on Gemma 3 270M Q4_K_M prompts evaluate 1.1-1.3x and n-gram speculation runs ~5 % faster).",
            LOADING, negation="--no-batch-invariant"),
    Setting("sampling_on", AUTO, "--sampling-on", "choice", "auto, backend or host",
            lambda v: v in SAMPLING_ON,
            "Where the filters (top-k, top-p, min-p) run: backend, in llama.cpp's graph, so only their "
            "survivors reach Python (needs top-k, or temp 0); host, over the whole row in C or numpy; "
            "auto: the target's rows on the host (measured faster on a CPU and on a GPU), a drafter's in "
            "its graph where the target is offloaded to a GPU.",
            (RUN, BENCH, CHAT, SERVE), choices=SAMPLING_ON),
    Setting("ctx", 4096, "--ctx", "int", f"a whole number from {MIN_CONTEXT} to {MAX_CONTEXT} (tokens of "
            "context)", lambda v: MIN_CONTEXT <= v <= MAX_CONTEXT, "Context size in tokens.", LOADING,
            short="-c"),
    Setting("threads", 0, "--threads", "int", f"a whole number from 0 to {MAX_THREADS} (0: one per core)",
            lambda v: 0 <= v <= MAX_THREADS, "CPU threads (0: one per core).", (*LOADING, DEMO), short="-t"),
    Setting("gpu_layers", 0, "--gpu-layers", "int", "a whole number >= 0 (or -1: all layers)",
            lambda v: -1 <= v <= MAX_INT32, "Layers to offload to the GPU (Metal/CUDA builds; -1: all).",
            LOADING, short="-ngl"),
)}
SETTING_NAMES: tuple[str, ...] = tuple(SETTINGS)


def _default(name: str) -> Any:
    return SETTINGS[name].default


@dataclass(frozen=True)
class RunSettings:
    """The effective settings of a run (after every source is merged); by default, SETTINGS' defaults.
    A seed of None: a random seed per generation."""

    temp: float = _default("temp")
    top_k: int = _default("top_k")
    top_p: float = _default("top_p")
    min_p: float = _default("min_p")
    draft_max: int | str = _default("draft_max")
    draft_p_min: float = _default("draft_p_min")
    max_tokens: int = _default("max_tokens")
    seed: int | None = _default("seed")
    stop: tuple[str, ...] = _default("stop")
    same_as_plain: bool = _default("same_as_plain")
    ignore_eos: bool = _default("ignore_eos")
    batch_invariant: bool = _default("batch_invariant")
    sampling_on: str = _default("sampling_on")
    ctx: int = _default("ctx")
    threads: int = _default("threads")
    gpu_layers: int = _default("gpu_layers")

    def merged(self, *updates: Mapping[str, Any]) -> RunSettings:
        """These settings with each checked update (from `parse_updates`) applied in turn."""
        out = self
        for values in updates:
            if values:
                out = replace(out, **values)
        return out

    def updated(self, values: Mapping[str, Any], source: Source) -> RunSettings:
        """These settings with raw `values` from `source`, checked (SettingError) and applied."""
        return self.merged(parse_updates(values, source))

    def seeded(self) -> RunSettings:
        """These settings with a concrete seed (random_seed when none is set)."""
        return self if self.seed is not None else replace(self, seed=random_seed())

    def seed_at(self, offset: int) -> int:
        """The seed of the `offset`-th generation of a series (chat's turns, bench's pairs): the seed
        plus the offset, wrapped within the seed range so each can be given back to `--seed`."""
        assert self.seed is not None
        return (self.seed + offset) % (MAX_SEED + 1)

    def validate(self) -> RunSettings:
        """Check every value (for settings built in code rather than parsed): SettingError naming the
        field, or these settings."""
        source = Source(text=False, spellings={})
        for name in SETTINGS:
            value = getattr(self, name)
            if name == "seed" and value is None:
                continue
            parse_value(name, list(value) if name == "stop" else value, source)
        return self

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


DEFAULTS = RunSettings()  # every setting's default, as a record (DEFAULTS.temp ...)

# The built-in defaults of each command, where they differ from SETTINGS'.
COMMAND_DEFAULTS: dict[str, dict[str, Any]] = {
    RUN: {},
    EXPORT: {},  # the command line of a server that runs as `specli run` would
    CHAT: {"max_tokens": 512},
    # As llama-bench: every run generates exactly -n tokens; pairs are seeded from 0 unless -s says.
    BENCH: {"max_tokens": 128, "ctx": 2048, "seed": 0, "ignore_eos": True},
    # Gemma 3 270M with n-gram lookup: text, panel, verdict and next steps fit a 40-line terminal.
    DEMO: {"max_tokens": 120, "temp": 0.0},
    "demo-synthetic": {"max_tokens": 96, "temp": 0.0, "draft_max": 3},  # a fixed k, so the colours show
    # Chat UIs and OpenAI's clients send no max_tokens unless told to: a reply runs to its end of text.
    SERVE: {"max_tokens": 4096},
}


# Settings a command replaces with its own options (bench: its --temp and -k lists), so a bad value of
# them in models.toml does not concern it.
UNUSED_BY_COMMAND: dict[str, frozenset[str]] = {BENCH: frozenset({"temp", "draft_max"})}


def defaults_for(command: str) -> RunSettings:
    return DEFAULTS.merged(COMMAND_DEFAULTS[command])


# -- sources --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where values come from and how the user spells each setting there. `text`: values arrive as text
    to parse (a flag, a slash command); otherwise as typed values (TOML, JSON) whose type must fit."""

    text: bool
    spellings: Mapping[str, str]
    file: str | None = None
    lines: Mapping[str, int] | None = None

    def spell(self, name: str) -> str:
        return self.spellings.get(name, name)

    def error(self, name: str, problem: str) -> SettingError:
        line = self.lines.get(name) if self.lines else None
        return SettingError(self.spell(name), problem, file=self.file, line=line)


FLAGS = Source(text=True, spellings={n: s.flag for n, s in SETTINGS.items()})
# A request's JSON fields (`specli serve`): typed values, named as the request names them.
REQUEST = Source(text=False, spellings={n: s.request for n, s in SETTINGS.items() if s.request})
REQUEST_FIELDS: dict[str, str] = {s.request: n for n, s in SETTINGS.items() if s.request}


def file_source(file: str, table: str, lines: Mapping[str, int] | None = None) -> Source:
    """Values of a models.toml table (`defaults`, `models.NAME`), named as `table.key` at their line."""
    return Source(text=False, spellings={n: f"{table}.{n}" for n in SETTINGS}, file=file, lines=lines)


def parse_updates(values: Mapping[str, Any], source: Source) -> dict[str, Any]:
    """Check `values` (setting name -> raw value; None: not given) from `source`: the normalised values,
    or SettingError for the first wrong one (an unknown name is a programming error: KeyError)."""
    out: dict[str, Any] = {}
    for name, raw in values.items():
        if raw is None:
            continue
        out[name] = parse_value(name, raw, source)
    return out


def parse_value(name: str, raw: Any, source: Source) -> Any:
    setting = SETTINGS[name]
    value = _convert(setting, raw, source, name)
    if not setting.valid(value):
        raise source.error(name, f"must be {setting.expected}, got {_show(value if source.text else raw)}")
    if setting.problem is not None and (why := setting.problem(value)) is not None:
        raise source.error(name, why)
    return value


def _convert(setting: Setting, raw: Any, source: Source, name: str) -> Any:
    kind = setting.kind
    if kind == "stops":
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
            raise source.error(name, f"must be {setting.expected} (or a list of them), got {_show(raw)}")
        for s in items:
            valid_text(s, source.spell(name))
            if not s:
                raise source.error(name, "must not be empty: an empty stop text would stop at once")
        return tuple(dict.fromkeys(items))
    if kind == "choice":
        if not isinstance(raw, str):
            raise source.error(name, f"must be {setting.expected}, got {_show(raw)}")
        return raw.strip().lower() if source.text else raw
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if source.text and isinstance(raw, str) and raw.strip().lower() in ("true", "false", "1", "0"):
            return raw.strip().lower() in ("true", "1")
        raise source.error(name, f"must be true or false, got {_show(raw)}")
    if source.text and isinstance(raw, str):
        text = raw.strip()
        if kind == "k" and text == AUTO:
            return AUTO
        try:
            number: float = float(text) if kind == "float" else int(text)
        except ValueError:
            raise source.error(name, f"takes {setting.expected}, not {raw.strip()!r}") from None
        raw = number
    if kind == "k" and raw == AUTO:
        return AUTO
    if kind == "float":
        if not isinstance(raw, (int, float)) or isinstance(raw, bool):
            raise source.error(name, f"must be {setting.expected}, got {_show(raw)}")
        if not math.isfinite(raw):
            raise source.error(name, f"must be {setting.expected}, got {_show(raw)}")
        return float(raw)
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise source.error(name, f"must be {setting.expected}, got {_show(raw)}")
    if kind == "seed" and raw == RANDOM_SEED:
        return None
    return raw


def _show(raw: Any) -> str:
    if isinstance(raw, float):
        return f"{raw:g}"
    return repr(raw) if isinstance(raw, str) else str(raw)


# -- text input -----------------------------------------------------------------------------------------


def valid_text(text: str, what: str) -> str:
    """`text` if it is valid Unicode. Bytes that are not UTF-8 (in argv or on stdin) reach Python as
    lone surrogates and would fail much later with "surrogates not allowed"."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start : e.end].encode("utf-8", "surrogateescape")[:4]
        raise UsageProblem(
            f"{what} is not valid UTF-8 text (byte {bad.hex(' ')} at character {e.start})"
        ) from None
    return text


def decode_input(data: bytes, what: str) -> str:
    """Bytes read from stdin or a file as UTF-8, or a one-line UsageProblem saying where they are not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageProblem(f"{what} is not valid UTF-8 text (byte {data[e.start:e.start + 1].hex()} at "
                           f"offset {e.start})") from None
