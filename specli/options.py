"""The one options layer: every front end (run, bench, chat and its slash commands, models.toml values
after merging) checks generation settings here, so a bad value gets the same one-line message and the
same exit code (2) wherever it is typed."""

from __future__ import annotations

import math
from typing import Any

from specli.errors import UsageProblem

# Below this a temperature is greedy in all but name, and 1/T (with logits of a few tens) heads for
# float32 overflow: 1e-40 gave infinite logits and "no mass". llama.cpp has no lower bound of its own.
MIN_TEMPERATURE = 1e-4
MIN_CONTEXT = 16
# llama.cpp holds n_ctx in a uint32 and pads it up to a multiple of 256 (src/llama-context.cpp).
MAX_CONTEXT = 2**32 - 256
MAX_SEED = 2**32 - 1
RANDOM_SEED = -1  # llama.cpp's `-s -1`: a random seed (LLAMA_DEFAULT_SEED)
MAX_DRAFT_K = 64
# llama.cpp's default sampler settings, and every front end's (sampling.DEFAULT_SAMPLING holds them).
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05


def temperature_problem(t: float) -> str | None:
    """Why `t` is not a usable temperature, or None."""
    if not math.isfinite(t) or t < 0:
        return f"must be a finite number >= 0 (0 is greedy), got {t:g}"
    if 0 < t < MIN_TEMPERATURE:
        return (f"must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {t:g}: a smaller temperature "
                "is greedy in all but name and overflows the arithmetic")
    return None


def check_temperature(t: float, option: str = "--temp") -> float:
    """`t` if it is a usable temperature; otherwise UsageProblem naming `option` as the user typed it."""
    if (why := temperature_problem(t)) is not None:
        raise UsageProblem(f"{option} {why}")
    return t


def parse_temperature(value: str, option: str = "--temp") -> float:
    """A temperature typed as text (chat's `/temp X`), checked as --temp is."""
    try:
        t = float(value)
    except ValueError:
        raise UsageProblem(f"{option} takes a number >= 0, not {value.strip()!r}") from None
    return check_temperature(t, option)


def parse_draft_max(value: str | int, option: str = "--draft-max") -> int | str:
    """Tokens drafted per round: a whole number 0..MAX_DRAFT_K or "auto" (`option`: as the user typed it,
    e.g. chat's `/k`)."""
    text = str(value).strip()
    if text == "auto":
        return "auto"
    try:
        k = int(text)
    except ValueError:
        raise UsageProblem(
            f"{option} takes a whole number 0..{MAX_DRAFT_K} or 'auto', not {text!r}"
        ) from None
    if not 0 <= k <= MAX_DRAFT_K:
        raise UsageProblem(f"{option} must be between 0 and {MAX_DRAFT_K}, got {k}")
    return k


def normalise_seed(seed: int | None) -> int | None:
    """-1 (llama.cpp's spelling of "random") becomes None; anything else must fit a uint32."""
    if seed is None or seed == RANDOM_SEED:
        return None
    if not 0 <= seed <= MAX_SEED:
        raise UsageProblem(f"--seed must be a whole number from 0 to {MAX_SEED}, or -1 for a random seed; "
                           f"got {seed}")
    return seed


def check_values(values: dict[str, Any]) -> dict[str, Any]:
    """Check the effective setting values (flags merged with models.toml) of any command; returns
    them normalised (seed -1 -> None). Raises UsageProblem naming the option."""
    out = dict(values)
    if out.get("temp") is not None:
        check_temperature(float(out["temp"]))
    if out.get("top_p") is not None and not 0 < out["top_p"] <= 1:
        raise UsageProblem(f"--top-p must be in (0, 1] (1: off), got {out['top_p']:g}")
    if out.get("min_p") is not None and not 0 <= out["min_p"] <= 1:
        raise UsageProblem(f"--min-p must be in [0, 1] (0: off), got {out['min_p']:g}")
    if out.get("top_k") is not None and out["top_k"] < 0:
        raise UsageProblem(f"--top-k must be >= 0 (0: off), got {out['top_k']}")
    if out.get("max_tokens") is not None and out["max_tokens"] < 1:
        raise UsageProblem(f"--max-tokens must be >= 1, got {out['max_tokens']}")
    if out.get("ctx") is not None and not MIN_CONTEXT <= out["ctx"] <= MAX_CONTEXT:
        raise UsageProblem(f"--ctx must be from {MIN_CONTEXT} to {MAX_CONTEXT} tokens, got {out['ctx']}")
    if out.get("threads") is not None and out["threads"] < 0:
        raise UsageProblem(f"--threads must be >= 0 (0: one per core), got {out['threads']}")
    if "seed" in out:
        out["seed"] = normalise_seed(out["seed"])
    if out.get("draft_max") is not None:
        out["draft_max"] = parse_draft_max(out["draft_max"])
    return out


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
