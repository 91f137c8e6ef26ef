"""specli.settings' table is the one statement of every setting and its default: no default is written
again in specli/, and each command's options, README's tables, models.toml's keys and the API's fields
agree with it."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import typer

import specli
from specli import config as config_module
from specli.cli import app
from specli.config import load_config
from specli.serve.protocol import request_settings
from specli.settings import (
    AUTO,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULTS,
    REQUEST_FIELDS,
    RUN,
    SETTINGS,
    RunSettings,
    Setting,
    defaults_for,
)

PACKAGE = Path(specli.__file__).parent
REPO = PACKAGE.parent

# Defaults distinctive enough to look for anywhere, and numbers common enough (buffer sizes, block
# lengths) that only a default position (a parameter's, a field's, an option's) counts.
ANYWHERE = (*(SETTINGS[name].default for name in ("temp", "top_p", "min_p")), DEFAULT_HOST, DEFAULT_PORT,
            AUTO)
AS_DEFAULTS = tuple(SETTINGS[name].default for name in ("top_k", "max_tokens", "ctx"))
# The same numbers, meaning something else.
ALLOWED = {
    ("policy.py", 0.8): "an edge of the draft-confidence histogram's bins",
    ("policy.py", 0.95): "an edge of the draft-confidence histogram's bins",
    ("costs.py", 0.05): "OPTIMISTIC_SLOPE, a tuning of the cost model (docs/tuning.md)",
    ("ui/bench_view.py", 40): "the speedup chart's width in characters",
}


def _same(a: object, b: object) -> bool:
    return type(a) is type(b) and a == b


def _default_positions(tree: ast.AST) -> list[ast.Constant]:
    """Constants given as a default: a parameter's, a class field's, a `default=`, an Option's."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            found += [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
        elif isinstance(node, ast.ClassDef):
            found += [s.value for s in node.body if isinstance(s, ast.Assign | ast.AnnAssign) and s.value]
        elif isinstance(node, ast.Call):
            found += [k.value for k in node.keywords if k.arg == "default"]
            if getattr(node.func, "attr", getattr(node.func, "id", None)) in ("Option", "Argument"):
                found += node.args[:1]
    return [c for node in found for c in ast.walk(node) if isinstance(c, ast.Constant)]


def test_no_default_is_written_outside_the_table() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "settings.py":
            continue
        where = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = [(c, ANYWHERE) for c in ast.walk(tree) if isinstance(c, ast.Constant)]
        constants += [(c, AS_DEFAULTS) for c in _default_positions(tree)]
        for constant, values in constants:
            for value in values:
                if _same(constant.value, value) and (where, value) not in ALLOWED:
                    found.append(f"{where}:{constant.lineno}: {value!r}")
    assert not found, "defaults written outside specli/settings.py: " + ", ".join(found)


def test_the_table_is_the_records_defaults() -> None:
    from specli.api import load
    from specli.engine import GenerationParams
    from specli.llama import ModelOptions
    from specli.sampling import SamplingParams

    assert RunSettings() == DEFAULTS and all(getattr(DEFAULTS, n) == s.default for n, s in SETTINGS.items())
    params, sampler, options = GenerationParams(), SamplingParams(), ModelOptions()
    assert (params.max_tokens, params.draft_max, params.seed, tuple(params.stop), params.same_as_plain,
            params.ignore_eos, params.sampling_on) == (DEFAULTS.max_tokens, DEFAULTS.draft_max, DEFAULTS.seed,
                                                       DEFAULTS.stop, DEFAULTS.same_as_plain,
                                                       DEFAULTS.ignore_eos, DEFAULTS.sampling_on)
    # The plain sampler: the default temperature, every filter off.
    assert (sampler.temperature, sampler.top_k, sampler.top_p, sampler.min_p) == (
        DEFAULTS.temp, SETTINGS["top_k"].off, SETTINGS["top_p"].off, SETTINGS["min_p"].off)
    assert SamplingParams.of(DEFAULTS) == SamplingParams(DEFAULTS.temp, DEFAULTS.top_k, DEFAULTS.top_p,
                                                          DEFAULTS.min_p)
    assert (options.n_ctx, options.n_threads, options.n_gpu_layers, options.batch_invariant) == (
        DEFAULTS.ctx, DEFAULTS.threads, DEFAULTS.gpu_layers, DEFAULTS.batch_invariant)
    load_defaults = {name: p.default for name, p in inspect.signature(load).parameters.items()}
    assert (load_defaults["n_ctx"], load_defaults["n_threads"], load_defaults["n_gpu_layers"],
            load_defaults["draft_p_min"], load_defaults["batch_invariant"]) == (
        DEFAULTS.ctx, DEFAULTS.threads, DEFAULTS.gpu_layers, DEFAULTS.draft_p_min, DEFAULTS.batch_invariant)


# -- each command's options ---------------------------------------------------------------------------


def _commands() -> dict[str, object]:
    group = typer.main.get_command(app)
    return group.commands  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", ["run", "bench", "chat", "serve", "export", "demo"])
def test_a_commands_setting_options_are_the_table_rows_that_name_it(command: str) -> None:
    params = {p.name: p for p in _commands()[command].params}  # type: ignore[attr-defined]
    assert {n for n in params if n in SETTINGS} == {n for n, s in SETTINGS.items() if command in s.commands}
    for name in set(params) & set(SETTINGS):
        setting, param = SETTINGS[name], params[name]
        assert sorted(param.opts) == sorted(flag for flag in (setting.short, setting.flag) if flag)
        negation = setting.negation_for.get(command, setting.negation)
        assert param.secondary_opts == ([negation] if negation else [])
        assert param.help.startswith(setting.help_for.get(command, setting.help))
        if setting.kind not in ("bool", "stops"):
            default = getattr(defaults_for(command), name)
            assert param.help.endswith(f"[default: {'random' if default is None else default}]")


# -- README, models.toml, the API -------------------------------------------------------------------


def _readme_default(setting: Setting) -> str:
    """A default as README's option table writes it."""
    value = setting.default
    if setting.kind == "bool":
        return "on" if value else "off"
    if value is None:
        return "random"
    if setting.name == "threads" and value == 0:
        return "one per core"
    if setting.kind == "stops":
        return ""
    if isinstance(value, str):
        return f"`{value}`"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _readme_run_table() -> dict[str, str]:
    """README's `specli run` table: each flag and the default its row gives it."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## `specli run`"):text.index("\n## ", text.index("## `specli run`") + 1)]
    shown = {}
    for line in section.splitlines():
        if not line.startswith("| `-"):
            continue
        flags_cell, default_cell = (cell.strip() for cell in line.strip("|").split("|")[:2])
        groups = [re.findall(r"`(-[\w-]+)", group) for group in flags_cell.split(" / ")]
        defaults = [d.strip() for d in default_cell.split(" / ")]
        if len(defaults) == 1:  # a flag and its negation (--same-as-plain / --no-same-as-plain)
            defaults *= len(groups)
        for flags, default in zip(groups, defaults, strict=True):
            shown.update(dict.fromkeys(flags, default))
    return shown


def test_readmes_run_table_is_runs_options_with_the_tables_defaults() -> None:
    shown = _readme_run_table()
    options = {opt for p in _commands()["run"].params  # type: ignore[attr-defined]
               for opt in (*p.opts, *p.secondary_opts) if opt.startswith("-")} - {"-h", "--help"}
    assert set(shown) == options
    for setting in SETTINGS.values():
        if RUN in setting.commands:
            for flag in (setting.flag, setting.short, setting.negation):
                if flag:
                    assert shown[flag] == _readme_default(setting), flag


def test_readme_names_every_models_toml_key() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("Settings (in `[defaults]` or per model) are named like their flags (")
    listed = re.findall(r"`(\w+)`", text[start:text.index(")", text.index("(`", start))])
    assert set(listed) == set(SETTINGS)


def test_models_tomls_example_defaults_are_the_tables() -> None:
    """The repository's models.toml shows [defaults] commented out: its keys are settings, and a value
    not marked as an example ("default: ...") is the default."""
    text = (REPO / "models.toml").read_text(encoding="utf-8")
    block = text[text.index("# [defaults]\n"):].split("\n\n")[0].splitlines()[1:]
    assert block
    for line in block:
        key, _, rest = line.removeprefix("# ").partition(" = ")
        value, _, comment = rest.partition("#")
        assert key in SETTINGS, line
        if "default:" not in comment:
            assert config_module.tomllib.loads(f"v = {value}")["v"] == SETTINGS[key].default, line


def test_models_toml_takes_every_setting_by_its_name(tmp_path: Path) -> None:
    toml = {"int": str, "float": str, "k": lambda v: f'"{v}"' if v == AUTO else str(v),
            "bool": lambda v: str(v).lower(), "seed": lambda v: "-1" if v is None else str(v),
            "stops": lambda v: "[]", "choice": lambda v: f'"{v}"'}
    lines = [f"{name} = {toml[s.kind](s.default)}" for name, s in SETTINGS.items()]  # type: ignore[operator]
    (tmp_path / "models.toml").write_text("[defaults]\n" + "\n".join(lines) + "\n", encoding="utf-8")
    config = load_config(tmp_path / "models.toml")
    assert set(config.defaults) == set(SETTINGS) and DEFAULTS.merged(config.defaults) == DEFAULTS


# A valid value other than the default of every setting a request may set.
REQUEST_SAMPLES = {"temp": 0.5, "top_k": 7, "top_p": 0.5, "min_p": 0.1, "draft_max": 3, "draft_p_min": 0.5,
                   "max_tokens": 9, "seed": 5, "stop": ["x"], "same_as_plain": False, "ignore_eos": True}


def test_a_requests_fields_are_the_tables() -> None:
    assert set(REQUEST_FIELDS.values()) == set(REQUEST_SAMPLES)
    docs = (REPO / "docs" / "serve.md").read_text(encoding="utf-8")
    docs = docs[docs.index("## Request fields"):docs.index("\n## ", docs.index("## Request fields") + 1)]
    for field, name in REQUEST_FIELDS.items():
        assert f"`{field}`" in docs, field
        outer, _, inner = field.partition(".")
        body = {outer: {inner: REQUEST_SAMPLES[name]}} if inner else {field: REQUEST_SAMPLES[name]}
        value = getattr(request_settings(body, DEFAULTS), name)
        assert value == (tuple(REQUEST_SAMPLES[name]) if name == "stop" else REQUEST_SAMPLES[name]), field
