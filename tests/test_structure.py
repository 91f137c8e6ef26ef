"""The shape of the package: the core below the front ends, no import circles, and a drafter registry
that every front end reads (a new drafter is one file and one entry)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.style import Style
from typer.testing import CliRunner

import specli
import specli_synth
from specli import load
from specli.cli import app
from specli.drafters.registry import DRAFTERS, RESERVED_NAMES, colour_of, draft_help, drafter_kind
from specli.settings import SettingError

PACKAGE = Path(specli.__file__).parent
SYNTH = Path(specli_synth.__file__).parent


def _modules(*packages: Path) -> dict[str, Path]:
    out = {}
    for package in packages or (PACKAGE,):
        for path in package.rglob("*.py"):
            parts = path.relative_to(package.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path, modules: dict[str, Path], *, typing_too: bool = False) -> set[str]:
    """Modules of the packages that `path` imports anywhere (functions too), but under TYPE_CHECKING
    (unless `typing_too`). A package's own name (`from specli import costcache`) is not its __init__."""
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if not typing_too and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)

    Visitor().visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in modules}


@pytest.mark.parametrize("typing_too", [False, True], ids=["at run time", "annotations too"])
def test_no_import_circles(typing_too: bool) -> None:
    """In specli and in the synthetic-model writer; with annotations' imports too, where a package's
    __init__ (which names its public API for type checkers) is not counted as importing its modules."""
    modules = _modules(PACKAGE, SYNTH)
    inits = {name for name, path in modules.items() if path.name == "__init__.py"}
    graph = {name: _imports(path, modules, typing_too=typing_too) - {name} - (inits if typing_too else set())
             for name, path in modules.items()}
    state: dict[str, int] = {}
    trail: list[str] = []
    circles: list[list[str]] = []

    def visit(name: str) -> None:
        state[name] = 1
        trail.append(name)
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                circles.append([*trail[trail.index(other):], other])
            elif other not in state:
                visit(other)
        trail.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not circles, [" -> ".join(c) for c in circles]


CORE = ("llama", "llama_log", "host", "builtin_templates", "gguf_info", "chat_template", "sampling",
        "verify", "drafters.base", "drafters.model", "drafters.ngram", "drafters.mtp", "drafters.head",
        "drafters.eagle3", "drafters.dflash", "drafters.combined", "drafters.registry", "heads", "policy",
        "proposer", "costs", "costcache", "engine", "events", "stats", "textstream", "api", "settings",
        "runplan", "config", "signals", "text")


def test_settings_are_at_the_bottom_of_the_house() -> None:
    """The table of every setting and its default imports nothing of specli's (no engine, no front end),
    so that every layer can take its defaults from it; and nothing but front ends reads the flags."""
    modules = _modules()
    assert _imports(PACKAGE / "settings.py", modules, typing_too=True) == set()
    front_ends = ("specli.cli", "specli.flags", "specli.show", "specli.demo", "specli.models_cmd",
                  "specli.bench.command")
    for name, path in modules.items():
        if "specli.flags" in _imports(path, modules):
            assert name in front_ends, f"{name} builds command-line options"


@pytest.mark.parametrize("module", ["specli", "specli.api", *(f"specli.{m}" for m in CORE)])
def test_the_core_loads_no_front_end(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in ('typer', 'rich', 'click') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"{module} loads {proc.stdout.strip()}"


def test_the_launcher_imports_nothing_heavy() -> None:
    """The console script's first module installs the signal handlers before numpy, llama.cpp, typer
    and rich are imported (a Ctrl-C during those imports must not be a traceback)."""
    heavy = ("numpy", "llama_cpp", "typer", "rich", "click", "jinja2")
    code = f"import sys, specli.launcher; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"specli.launcher loads {proc.stdout.strip()}"


def test_the_synthetic_model_writer_is_not_in_the_runtime_package() -> None:
    assert not (PACKAGE / "synth").exists()
    for path in PACKAGE.rglob("*.py"):
        # The demo builds its synthetic pair with specli-synth when it is installed, and says so when not.
        assert "specli_synth" not in path.read_text(encoding="utf-8") or path == PACKAGE / "demo.py", path


# -- the drafter registry ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_every_registered_drafter_is_described_coloured_and_offered(name: str) -> None:
    kind = DRAFTERS[name]
    assert kind.description and kind.needs
    Style.parse(kind.colour)  # a colour the terminal can show...
    page = (PACKAGE / "serve" / "static" / "app.js").read_text(encoding="utf-8")
    css = page[page.index("const CSS_COLOURS"):page.index("};", page.index("const CSS_COLOURS"))]
    assert f"{kind.colour}:" in css  # ...and the page
    assert colour_of(name) == kind.colour
    if kind.reserved:
        assert name in draft_help() and drafter_kind(name) is kind
    help_text = " ".join(CliRunner().invoke(app, ["run", "--help"]).stdout.split())
    help_text = re.sub(r"(\w)- (\w)", r"\1-\2", help_text)  # a hyphenated word broken at a line's end
    assert kind.description.split(":")[0] in help_text or not kind.reserved


def test_drafters_take_their_names_from_the_registry() -> None:
    """A drafter's name (its tokens' source, the policy's key, its colour) is its registry entry's, which
    the entry's factory gives it: no drafter module writes a name or a source's name of its own."""
    for path in sorted((PACKAGE / "drafters").glob("*.py")):
        if path.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                named = [getattr(t, "id", None) or getattr(t, "attr", None) for t in targets]
                assert "name" not in named, f"{path.name}:{node.lineno} states a drafter's name"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Source" and node.args:
                assert not isinstance(node.args[0], ast.Constant), f"{path.name}:{node.lineno} names a source"


def test_the_policy_prices_the_longest_round() -> None:
    """The gate prices every batch a round can verify: the longest draft settings allow, and one token."""
    from specli.policy import HORIZON
    from specli.settings import MAX_DRAFT_K

    assert HORIZON == MAX_DRAFT_K + 1


@pytest.mark.parametrize("name", RESERVED_NAMES)
def test_reserved_drafter_names_cannot_name_a_model(name: str, tmp_path: Path) -> None:
    from specli.config import ConfigError, load_config

    path = tmp_path / "models.toml"
    path.write_text(f'[models.{name}]\npath = "x.gguf"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=f"'{name}' is reserved"):
        load_config(path)


def test_the_registry_builds_each_drafter(fixture_models, trained_drafters, tmp_path: Path) -> None:
    """Each entry's factory, through api.load as every front end uses it: the drafter it builds names
    its tokens with the entry's name, or refuses the target with a message naming the way out. A
    trained drafter's file says what it is (--draft FILE)."""
    from specli_synth.gemma4 import write_gemma4_set

    gemma4 = write_gemma4_set(tmp_path)
    for name, kind in DRAFTERS.items():
        target, draft = fixture_models.target, fixture_models.draft if not kind.reserved else name
        if hasattr(trained_drafters, name):
            target, draft = trained_drafters.target, getattr(trained_drafters, name)
        elif hasattr(gemma4, name):
            target, draft = gemma4.target, getattr(gemma4, name)
        if not kind.reserved and not kind.uses_model:
            assert drafter_kind(draft) is kind
        try:
            spec = load(target, draft, n_ctx=256, n_threads=1)
        except ValueError as e:
            assert kind.loads_target_mtp and "no MTP" in str(e)  # the fixture target has no MTP layers
            continue
        with spec:
            assert spec.drafter is not None and name in [s.name for s in spec.drafter.sources]
    assert drafter_kind(None) is None and drafter_kind("some/model.gguf") is DRAFTERS["draft"]


def test_a_setting_error_names_the_option_as_typed(fixture_models) -> None:
    result = CliRunner().invoke(app, ["run", "--target", str(fixture_models.target), "--top-p", "nan", "x"])
    assert result.exit_code == 2
    assert "--top-p must be a number in (0, 1] (1: off), got nan" in result.stderr
    error = SettingError("/temp", "must be 0 or more")
    assert (error.option, str(error)) == ("/temp", "/temp must be 0 or more")


# -- what cannot be decoded is refused before loading ---------------------------------------------------


def test_a_diffusion_model_is_refused(tmp_path: Path) -> None:
    from support import write_gguf

    model = write_gguf(tmp_path / "dream.gguf", arch="dream")
    result = CliRunner().invoke(app, ["run", "--target", str(model), "--no-draft", "hi"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a diffusion model (dream)" in lines[0]


def test_a_recurrent_target_without_rollback_is_refused_before_loading(tmp_path: Path) -> None:
    from support import OMIT, write_gguf

    model = write_gguf(tmp_path / "mamba.gguf", arch="mamba", n_head=OMIT, n_head_kv=OMIT)
    result = CliRunner().invoke(app, ["run", "--target", str(model), "--draft", "ngram", "hi"])
    assert result.exit_code == 1
    assert "recurrent/hybrid model (mamba)" in result.stderr and "--no-draft" in result.stderr
