"""From what a front end was given to a loaded run: the prompt read and checked, names resolved through
models.toml, settings merged (the command's defaults < [defaults] < the model's own < flags), model
files validated before llama.cpp sees them, then `api.load`. The one place a run is assembled, for
`specli run`, `chat`, `bench` and `serve`; no typer, no rich (front ends print the notes)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specli.drafters.registry import drafter_kind
from specli.settings import (
    SETTINGS,
    THREADS_PER_CORE,
    UNUSED_BY_COMMAND,
    RunSettings,
    UsageProblem,
    decode_input,
    defaults_for,
    thread_limit,
    usable_cores,
    valid_text,
)


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
    draft: str | Path | None  # a draft model's path, a reserved drafter name ("ngram", "mtp"), or None
    ngram: bool  # n-gram lookup in front of the draft model (combined drafting)
    settings: RunSettings
    target_name: str | None = None  # the models.toml name, when the target was given by one
    notes: list[str] = field(default_factory=list)  # for the user, before loading
    config: Path | None = None  # the models.toml read, if any

    @property
    def draft_model(self) -> Path | None:
        """The draft model's file, when the drafter is a model."""
        kind = drafter_kind(self.draft)
        return None if kind is None or kind.reserved else Path(self.draft)  # type: ignore[arg-type]


def model_name(text: str, what: str) -> str:
    """A model given by the user (a path or a models.toml name); an empty one is refused, where it
    used to become the path '.' and "is a directory"."""
    if not text.strip():
        raise UsageProblem(f"{what} is empty: give a .gguf path or a models.toml name")
    return text


def validated(path: Path, *, speculative_target: bool = False) -> Path:
    """Read the GGUF header and tensor table (no weights) and refuse what would crash llama.cpp, what
    does not generate left to right (a diffusion model), and, as a speculative target, a recurrent or
    hybrid model whose state the bundled llama.cpp cannot roll back (before minutes of loading)."""
    from specli.gguf_info import ROLLBACK_ARCHITECTURES, validate_gguf

    info = validate_gguf(path)
    if info.is_diffusion:
        raise ValueError(f"{path.name} is a diffusion model ({info.architecture}): it does not generate one "
                         "token after another, so there is nothing for specli to decode or speculate on")
    if speculative_target and info.is_recurrent and info.architecture not in ROLLBACK_ARCHITECTURES:
        from specli.engine import cannot_roll_back

        raise ValueError(cannot_roll_back(path.name, info.architecture))  # the engine's, before loading
    return path


def plan_run(
    command: str,
    target: str,
    draft: str | None,
    *,
    no_draft: bool = False,
    ngram: bool = False,
    config: str | Path | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Plan:
    """Resolve names or paths through models.toml and merge the settings: `command`'s defaults <
    [defaults] < the model's own < `flags` (checked values, from specli.settings.parse_updates)."""
    if no_draft and draft is not None:
        raise UsageProblem("--draft and --no-draft contradict each other: give one of them")
    model_name(target, "the target (--target)")
    if draft is not None:
        model_name(draft, "the draft (--draft)")
    cfg, notes = open_registry(config, [target, draft])
    found = cfg.path if cfg is not None else None
    settings = defaults_for(command)
    name = None
    if cfg is None:
        if not target.lower().endswith(".gguf") and not Path(target).expanduser().exists():
            raise UsageProblem(
                f"{target!r} is not a file, and no models.toml was found to look it up in "
                "(give a .gguf path, or see `specli models`)"
            )
        target_path, default_draft = Path(target).expanduser(), None
    else:
        resolved = cfg.resolve(target)
        target_path, default_draft, name = resolved.path, resolved.draft, resolved.name
        changed = [f"{key} = {value!r}" for key, value in resolved.settings.items()
                   if key not in (flags or {}) and key not in resolved.problems
                   and value != getattr(settings, key)]
        if changed:  # models.toml outranks the command's own defaults: never silently
            notes.append(f"{_shown(found)} sets {', '.join(changed)} (its [defaults] and the model's "
                         "table outrank the command's defaults; flags outrank both)")
        settings = settings.merged(resolved.settings)
        unused = UNUSED_BY_COMMAND.get(command, frozenset())
        for setting, error in resolved.problems.items():
            if setting in (flags or {}):
                notes.append(f"ignoring {error} (overridden by {SETTINGS[setting].flag})")
            elif setting in unused:
                notes.append(f"ignoring {error} ({command} does not use it)")
            else:
                raise error
    settings = settings.merged(flags or {})
    _check_threads(settings.threads, "--threads" if "threads" in (flags or {}) else f"threads in {found}")
    draft_arg: str | Path | None = None
    if not no_draft:
        wanted = draft if draft is not None else default_draft
        kind = drafter_kind(wanted)
        if kind is not None and kind.reserved:
            draft_arg = kind.name
        elif wanted is not None:
            draft_arg = validated(cfg.resolve(wanted).path if cfg else Path(wanted).expanduser())
    if ngram and (draft_arg is None or drafter_kind(draft_arg).reserved):  # type: ignore[union-attr]
        raise UsageProblem(
            "--ngram adds n-gram lookup to a draft model, and there is none: give --draft MODEL "
            "(or --draft ngram for n-gram lookup alone)"
        )
    if ngram and not drafter_kind(draft_arg).uses_model:  # type: ignore[union-attr]
        kind = drafter_kind(draft_arg)
        raise UsageProblem(f"--ngram adds n-gram lookup to a draft model; {Path(str(draft_arg)).name} is "
                           f"{kind.needs} ({kind.name}), which drafts alone: drop --ngram")  # type: ignore[union-attr]
    plan = Plan(validated(target_path, speculative_target=draft_arg is not None), draft_arg, ngram, settings,
                name, notes, config=found)
    if plan.draft_model is not None and plan.draft_model.resolve() == plan.target.resolve():
        plan.notes.append("the draft is the target itself: every draft is accepted, but drafting costs as "
                          "much as verifying, so this cannot be faster")
    return plan


def _shown(path: Path | None) -> str:
    """A config path as the user would write it: relative to the working directory when inside it."""
    if path is None:
        return "models.toml"
    try:
        return f"./{path.resolve().relative_to(Path.cwd().resolve())}"
    except ValueError:
        return str(path)


def _is_path(text: str) -> bool:
    """Whether a model argument is a path or a drafter, not a name to look up (as Config.resolve)."""
    kind = drafter_kind(text)
    return ((kind is not None and kind.reserved) or text.lower().endswith(".gguf") or "/" in text
            or os.sep in text or Path(text).expanduser().is_file())


def open_registry(config: str | Path | None, models: list[str | None]) -> tuple[Any, list[str]]:
    """The models.toml to look `models` up in (None if there is none), and notes for the user. A file
    found by itself (./models.toml, the user's) that does not load as specli's registry (another
    tool's file of that name) does not stop a command whose models are all paths: it is ignored, said
    in a note. One named by --config or $SPECLI_CONFIG always counts."""
    from specli.config import ENV_VAR, ConfigError, find_config, load_config

    found = find_config(config)
    if found is None:
        return None, []
    try:
        return load_config(found, strict=False), []
    except ConfigError as e:
        if config is not None or os.environ.get(ENV_VAR) or not all(_is_path(m) for m in models if m):
            raise
        return None, [f"ignoring {e} (no model is named by a models.toml name here)"]


def _check_threads(threads: int, where: str) -> None:
    limit = thread_limit()
    if threads > limit:
        raise UsageProblem(
            f"{where}: {threads} threads on {usable_cores()} usable CPU cores; at most {limit} here "
            f"({THREADS_PER_CORE} per core): threads that outnumber the cores only slow llama.cpp down "
            "(0: one per core)"
        )


def load_run(plan: Plan, *, verbose: bool = False) -> tuple[Any, list[str]]:
    """Load what `plan` names (`api.load`): the Speculator, and notes for the user about what they got."""
    from specli import llama_log
    from specli.api import load

    llama_log.set_verbose(verbose)
    s = plan.settings
    spec = load(plan.target, plan.draft, n_ctx=s.ctx, n_threads=s.threads, n_gpu_layers=s.gpu_layers,
                draft_p_min=s.draft_p_min, ngram=plan.ngram, batch_invariant=s.batch_invariant)
    notes = []
    bound = spec.target.max_rollback
    if spec.drafter is not None and isinstance(s.draft_max, int) and s.draft_max > bound:
        notes.append(f"draft length {s.draft_max} (-k): this {spec.target.architecture} target's recurrent "
                     f"state rolls back at most {bound} positions, so no round drafts more than {bound}")
    if spec.target.n_ctx != s.ctx:
        # llama.cpp rounds contexts up to a multiple of 256: say what the user got
        notes.append(f"the context is {spec.target.n_ctx} tokens (asked for {s.ctx}; "
                     "llama.cpp sizes contexts in multiples of 256)")
    return spec, notes
