"""From command-line values to a loaded run: the prompt read and checked, names resolved through
models.toml, settings merged and checked (CLI defaults < [defaults] < the model's own < typed flags),
model files validated before llama.cpp sees them, then `api.load`, the one place a run is assembled.
Shared by `specli run`, `chat` and `bench`; the CLI module only parses and calls down."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from specli.errors import UsageProblem
from specli.options import check_values, decode_input, parse_draft_max, valid_text


def read_prompt(prompt: str) -> str:
    if prompt == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        prompt = decode_input(stdin.read(), "the prompt on stdin") if stdin else sys.stdin.read()
    valid_text(prompt, "the prompt")
    if not prompt.strip():
        raise UsageProblem("the prompt is empty: give text as the argument, or '-' to read it from stdin")
    return prompt


@dataclass
class Plan:
    """What a command will load and with which settings, after models.toml and the flags are merged."""

    target: Path
    draft: str | Path | None  # a path, "ngram", "mtp", or None
    values: dict[str, Any]  # the effective setting values (see config.SETTING_NAMES)


def validated(path: Path) -> Path:
    """Read the GGUF header and tensor table (no weights) and refuse what would crash llama.cpp."""
    from specli.gguf_info import validate_gguf

    validate_gguf(path)
    return path


def plan_models(
    context: typer.Context, target: str, draft: str | None, *, no_draft: bool, config: Path | None
) -> Plan:
    """Resolve names or paths through models.toml; settings: CLI defaults < [defaults] < the model's
    own < flags given on the command line."""
    from specli.api import MTP, NGRAM
    from specli.config import explicit_cli_values, find_config, load_config, merge_settings

    if no_draft and draft is not None:
        raise UsageProblem("--draft and --no-draft contradict each other: give one of them")
    found = find_config(config)
    cfg = load_config(found) if found else None
    values = dict(context.params)
    if cfg is None:
        if not target.lower().endswith(".gguf") and not Path(target).expanduser().exists():
            raise UsageProblem(
                f"{target!r} is not a file, and no models.toml was found to look it up in "
                "(give a .gguf path, or see `specli models`)"
            )
        target_path, default_draft = Path(target).expanduser(), None
    else:
        resolved = cfg.resolve(target)
        target_path, default_draft = resolved.path, resolved.draft
        try:
            values.update(merge_settings(resolved.settings, explicit_cli_values(context)).as_dict())
        except ValueError as e:
            raise UsageProblem(str(e)) from None
    draft_arg: str | Path | None = None
    if not no_draft:
        wanted = draft if draft is not None else default_draft
        if wanted in (NGRAM, MTP):
            draft_arg = wanted
        elif wanted is not None:
            draft_arg = cfg.resolve(wanted).path if cfg else Path(wanted).expanduser()
            draft_arg = validated(Path(draft_arg))
    return Plan(validated(target_path), draft_arg, check_values(values))


def check_ngram(ngram: bool, draft: str | Path | None) -> None:
    """--ngram combines n-gram lookup with a draft model; without one it would do nothing."""
    from specli.api import MTP, NGRAM

    if ngram and (draft is None or draft in (NGRAM, MTP)):
        raise UsageProblem(
            "--ngram adds n-gram lookup to a draft model, and there is none: give --draft MODEL "
            "(or --draft ngram for n-gram lookup alone)"
        )


def load_plan(plan: Plan, *, ngram: bool, draft_p_min: float, verbose: bool, err: Console):
    from specli import llama
    from specli.api import MTP, NGRAM, load

    llama.set_verbose(verbose)
    v = plan.values
    draft = plan.draft
    if draft not in (None, NGRAM, MTP) and Path(draft).resolve() == plan.target.resolve():
        err.print(
            "[yellow]note:[/] the draft is the target itself: every draft is accepted, "
            "but drafting costs as much as verifying, so this cannot be faster"
        )
    what = plan.target.name + (f" + {Path(draft).name}" if draft else "")
    with err.status(Text(f"loading {what}")):
        spec = load(
            plan.target,
            draft,
            n_ctx=v["ctx"],
            n_threads=v["threads"],
            n_gpu_layers=v["gpu_layers"],
            draft_p_min=draft_p_min,
            ngram=ngram and draft not in (None, NGRAM, MTP),
        )
    if spec.target.n_ctx != v["ctx"]:
        # llama.cpp rounds contexts up to a multiple of 256: say what the user got
        err.print(
            f"[yellow]note:[/] the context is {spec.target.n_ctx} tokens (asked for {v['ctx']}; "
            "llama.cpp sizes contexts in multiples of 256)",
            soft_wrap=True,  # one line, also on a pipe
        )
    return spec


def generation_params(values: dict[str, Any], stop: tuple[str, ...] = ()):
    """GenerationParams from effective setting values (a random seed when none is set)."""
    from specli.engine import GenerationParams
    from specli.sampling import SamplingParams

    seed = values.get("seed")
    if seed is None or seed == -1:
        import secrets

        seed = secrets.randbelow(2**31)
    return GenerationParams(
        max_tokens=values["max_tokens"],
        sampling=SamplingParams(
            temperature=values["temp"], top_k=values["top_k"], top_p=values["top_p"], min_p=values["min_p"]
        ),
        seed=seed,
        stop=stop,
        draft_max=parse_draft_max(str(values["draft_max"])),
    )
