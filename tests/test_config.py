from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from support import SHARED_MODELS_DIR as SHARED_MODELS
from support import write_gguf

from specli import config as config_mod
from specli.config import (
    Config,
    ConfigError,
    find_config,
    load_config,
    model_rows,
)
from specli.settings import FLAGS, RunSettings, SettingError, defaults_for, parse_updates
from specli.ui.models_table import render_models_table

REPO = Path(__file__).resolve().parents[1]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def tiny_gguf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_gguf(path)


def config_error(path: Path) -> ConfigError | SettingError:
    """The error loading `path` gives: ConfigError for the file's shape, SettingError for a bad value."""
    with pytest.raises((ConfigError, SettingError)) as exc:
        load_config(path)
    assert "\n" not in str(exc.value)
    return exc.value


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No config anywhere: empty cwd, HOME and XDG dir under tmp_path, no $SPECLI_CONFIG."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("SPECLI_CONFIG", raising=False)
    monkeypatch.delenv("APPDATA", raising=False)
    monkeypatch.chdir(work)
    return tmp_path


# --------------------------------------------------------------------------------------------------
# finding the file
# --------------------------------------------------------------------------------------------------


def test_no_config_anywhere(isolated: Path) -> None:
    assert find_config(None) is None


def test_home_dot_config(isolated: Path) -> None:
    user = write(isolated / "home" / ".config" / "specli" / "models.toml", "")
    assert find_config(None) == user


def test_xdg_config_home_wins_over_home(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(isolated / "home" / ".config" / "specli" / "models.toml", "")
    xdg = write(isolated / "xdg" / "specli" / "models.toml", "")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(isolated / "xdg"))
    assert find_config(None) == xdg


def test_relative_xdg_config_home_is_ignored(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = write(isolated / "home" / ".config" / "specli" / "models.toml", "")
    write(isolated / "work" / "rel" / "specli" / "models.toml", "")
    monkeypatch.setenv("XDG_CONFIG_HOME", "rel")
    assert find_config(None) == user


def test_windows_appdata(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    appdata = write(isolated / "appdata" / "specli" / "models.toml", "")
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("APPDATA", str(isolated / "appdata"))
    assert find_config(None) == appdata


def test_cwd_wins_over_user_dir(isolated: Path) -> None:
    write(isolated / "home" / ".config" / "specli" / "models.toml", "")
    local = write(isolated / "work" / "models.toml", "")
    assert find_config(None).resolve() == local.resolve()


def test_env_wins_over_cwd(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(isolated / "work" / "models.toml", "")
    env = write(isolated / "env.toml", "")
    monkeypatch.setenv("SPECLI_CONFIG", str(env))
    assert find_config(None) == env


def test_explicit_wins_over_env(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLI_CONFIG", str(write(isolated / "env.toml", "")))
    explicit = write(isolated / "explicit.toml", "")
    assert find_config(explicit) == explicit


def test_missing_explicit_is_an_error(isolated: Path) -> None:
    write(isolated / "work" / "models.toml", "")  # must not be used as a fallback
    with pytest.raises(ConfigError) as exc:
        find_config(isolated / "nope.toml")
    assert str(exc.value) == f"{isolated / 'nope.toml'}: config file not found (given by --config)"


def test_missing_env_config_is_an_error(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(isolated / "work" / "models.toml", "")
    monkeypatch.setenv("SPECLI_CONFIG", str(isolated / "gone.toml"))
    with pytest.raises(ConfigError, match=r"config file not found \(given by \$SPECLI_CONFIG\)"):
        find_config(None)


def test_explicit_directory_is_an_error(isolated: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        find_config(isolated)


# --------------------------------------------------------------------------------------------------
# errors name file, line and key
# --------------------------------------------------------------------------------------------------


def test_syntax_error_has_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        [defaults]
        temp = 0.5
        top_k 40
    """)
    err = config_error(path)
    assert err.line == 3
    assert str(err).startswith(f"{path}:3: defaults: TOML syntax error: ")
    assert "'top_k 40'" in str(err)


def test_syntax_error_duplicate_table(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        [models.a]
        path = "a.gguf"

        [models.a]
        path = "b.gguf"
    """)
    err = config_error(path)
    assert err.line == 4 and "TOML syntax error" in str(err)


def test_unknown_key_in_defaults(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        # comment
        [defaults]
        temp = 0.5
        temperature = 0.7
    """)
    err = config_error(path)
    assert (err.line, err.key) == (4, "defaults.temperature")
    assert str(err).startswith(f"{path}:4: defaults.temperature: unknown key; did you mean 'temp'?")


def test_unknown_key_in_model(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        [defaults]
        temp = 0.5

        [models."qwen2.5-7b"]
        path = "q.gguf"
        drafts = "x"
    """)
    err = config_error(path)
    assert (err.line, err.key) == (6, 'models."qwen2.5-7b".drafts')
    assert "did you mean 'draft'?" in str(err)


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        [model.a]
        path = "a.gguf"
    """)
    err = config_error(path)
    assert (err.line, err.key) == (1, "model")
    assert "did you mean 'models'?" in str(err)


def test_unknown_key_in_inline_table(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        [models]
        a = { path = "a.gguf" }
        b = { path = "b.gguf", tmep = 0.1 }
    """)
    err = config_error(path)
    assert (err.line, err.key) == (3, "models.b.tmep")


def test_multiline_string_does_not_confuse_line_numbers(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", '''
        [models.a]
        path = "a.gguf"
        description = """
        ctx = 5
        """
        ctx = 8
    ''')
    err = config_error(path)
    assert (err.line, err.key) == (6, "models.a.ctx")


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("temp", "-0.5", "must be a finite number >= 0"),
    ("temp", '"hot"', "must be a finite number >= 0"),
    ("top_p", "0", "must be a number in (0, 1]"),
    ("top_p", "1.5", "must be a number in (0, 1]"),
    ("min_p", "-0.1", "must be a number in [0, 1]"),
    ("threads", "-1", "must be a whole number from 0 to 512"),
    ("threads", "true", "must be a whole number from 0 to 512"),
    ("top_k", "1.5", "must be a whole number >= 0"),
    ("ctx", "8", "must be a whole number from 16 to"),
    ("gpu_layers", "-2", "must be a whole number >= 0 (or -1: all layers)"),
    ("draft_max", "-1", 'must be a whole number from 0 to 64, or "auto"'),
    ("draft_max", "65", 'must be a whole number from 0 to 64, or "auto"'),
    ("draft_max", '"fast"', 'must be a whole number from 0 to 64, or "auto"'),
    ("max_tokens", "0", "must be a whole number >= 1"),
    ("seed", "-2", "must be a whole number from 0 to 4294967295"),
])
def test_bad_setting_values(tmp_path: Path, key: str, value: str, expected: str) -> None:
    path = write(tmp_path / "models.toml", f"""
        [models.m]
        path = "m.gguf"
        {key} = {value}
    """)
    err = config_error(path)
    assert (err.line, err.key) == (3, f"models.m.{key}")
    assert str(err).startswith(f"{path}:3: models.m.{key}: {expected}")
    assert str(err).endswith(f", got {value.replace('true', 'True')}".replace('"', "'"))


def test_valid_settings_accepted(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        [defaults]
        temp = 0
        top_p = 1
        draft_max = "auto"
        gpu_layers = -1
        seed = 0

        [models.m]
        path = "m.gguf"
        draft_max = 0
        threads = 4
    """)
    cfg = load_config(path)
    assert cfg.defaults == dict(temp=0.0, top_p=1.0, draft_max="auto", gpu_layers=-1, seed=0)
    assert isinstance(cfg.defaults["temp"], float)
    assert cfg.models["m"].settings == dict(draft_max=0, threads=4)


def test_draft_naming_unknown_model(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        [models.big]
        path = "big.gguf"
        draft = "smal"

        [models.small]
        path = "small.gguf"
    """)
    err = config_error(path)
    assert (err.line, err.key) == (3, "models.big.draft")
    assert "draft 'smal' is not a model defined in this file; did you mean 'small'?" in str(err)


def test_draft_pointing_at_itself(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        [models.big]
        path = "big.gguf"
        draft = "big"
    """)
    err = config_error(path)
    assert (err.line, err.key) == (3, "models.big.draft")
    assert "names itself as its draft" in str(err)


def test_model_without_path(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        [defaults]
        temp = 1

        [models.nopath]
        description = "x"
    """)
    err = config_error(path)
    assert (err.line, err.key) == (4, "models.nopath")
    assert 'missing key "path"' in str(err)


def test_model_not_a_table(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        [models]
        a = "a.gguf"
    """)
    err = config_error(path)
    assert (err.line, err.key) == (2, "models.a")


def test_path_must_be_a_string(tmp_path: Path) -> None:
    err = config_error(write(tmp_path / "models.toml", "[models.a]\npath = 3\n"))
    assert (err.line, err.key) == (2, "models.a.path") and "must be a string" in str(err)


def test_model_name_that_looks_like_a_path(tmp_path: Path) -> None:
    err = config_error(write(tmp_path / "models.toml", '[models."x.gguf"]\npath = "x.gguf"\n'))
    assert err.line == 1 and "must not be empty, end in .gguf" in str(err)


def test_unreadable_and_missing_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "none.toml")
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe[defaults]")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(tmp_path / "bin.toml")


# --------------------------------------------------------------------------------------------------
# paths: expansion, relative resolution, missing files
# --------------------------------------------------------------------------------------------------


def test_tilde_and_env_expansion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MODELS", str(tmp_path / "store"))
    path = write(tmp_path / "cfg" / "models.toml", """
        [models.a]
        path = "~/models/a.gguf"
        [models.b]
        path = "$MODELS/b.gguf"
        [models.c]
        path = "${MODELS}/sub/c.gguf"
    """)
    cfg = load_config(path)
    assert cfg.models["a"].path == tmp_path / "home" / "models" / "a.gguf"
    assert cfg.models["b"].path == tmp_path / "store" / "b.gguf"
    assert cfg.models["c"].path == tmp_path / "store" / "sub" / "c.gguf"
    assert cfg.models["b"].path_text == "$MODELS/b.gguf"


def test_relative_paths_are_relative_to_the_config_file(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "cfg" / "models.toml", """
        [models.a]
        path = "weights/a.gguf"
        [models.b]
        path = "../shared/b.gguf"
    """)
    monkeypatch.chdir(tmp_path)  # somewhere else: must not matter
    cfg = load_config(Path("cfg") / "models.toml")
    assert cfg.path == path
    assert cfg.models["a"].path == tmp_path / "cfg" / "weights" / "a.gguf"
    assert cfg.models["b"].path == tmp_path / "shared" / "b.gguf"


def test_missing_model_file_only_fails_when_resolved(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
        [defaults]
        temp = 0.7

        [models.gone]
        description = "not downloaded yet"
        path = "gone.gguf"
        url = "https://huggingface.co/org/repo/resolve/main/gone.gguf"
    """)
    cfg = load_config(path)  # listing/loading is fine
    assert [r["status"] for r in model_rows(cfg)] == ["missing"]
    with pytest.raises(ConfigError) as exc:
        cfg.resolve("gone")
    err = exc.value
    assert (err.line, err.key) == (6, "models.gone.path")
    assert str(err) == (f"{path}:6: models.gone.path: file not found: {tmp_path / 'gone.gguf'}; "
                        "download it from https://huggingface.co/org/repo/resolve/main/gone.gguf")


def test_missing_file_from_unset_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECLI_TEST_UNSET", raising=False)
    cfg = load_config(write(tmp_path / "models.toml", '[models.a]\npath = "$SPECLI_TEST_UNSET/a.gguf"\n'))
    with pytest.raises(ConfigError, match=r"environment variable \$SPECLI_TEST_UNSET is not set"):
        cfg.resolve("a")


# --------------------------------------------------------------------------------------------------
# name-or-path resolution and settings
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> Config:
    tiny_gguf(tmp_path / "big.gguf")
    tiny_gguf(tmp_path / "small.gguf")
    path = write(tmp_path / "models.toml", """
        [defaults]
        temp = 0.7
        top_k = 20
        ctx = 2048

        [models.big]
        path = "big.gguf"
        draft = "small"
        temp = 0.2
        draft_max = 6

        [models.small]
        path = "small.gguf"
    """)
    return load_config(path)


def test_resolve_name(registry: Config) -> None:
    r = registry.resolve("big")
    assert r.name == "big" and r.path == registry.path.parent / "big.gguf" and r.draft == "small"
    assert r.settings == dict(temp=0.2, top_k=20, ctx=2048, draft_max=6)
    assert registry.resolve("small").settings == registry.defaults


def test_resolve_unknown_name_suggests(registry: Config) -> None:
    with pytest.raises(ConfigError) as exc:
        registry.resolve("bigg")
    msg = str(exc.value)
    assert msg.startswith(f"{registry.path}: unknown model 'bigg'; did you mean 'big'?")
    assert "known models: big, small" in msg


def test_resolve_unknown_name_in_empty_registry(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path / "models.toml", "[defaults]\ntemp = 1\n"))
    with pytest.raises(ConfigError, match="no models are defined"):
        cfg.resolve("x")


def test_resolve_path_outside_registry(registry: Config, tmp_path: Path) -> None:
    other = tiny_gguf(tmp_path / "elsewhere" / "other.gguf")
    r = registry.resolve(str(other))
    assert (r.name, r.entry, r.draft, r.path) == (None, None, None, other)
    assert r.settings == registry.defaults


def test_resolve_nonexistent_gguf_path_is_left_to_the_validator(registry: Config, tmp_path: Path) -> None:
    r = registry.resolve(str(tmp_path / "later.gguf"))
    assert r.name is None and r.path == tmp_path / "later.gguf"


def test_resolve_path_of_registered_model_uses_its_entry(registry: Config,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(registry.path.parent)
    r = registry.resolve("./big.gguf")
    assert r.name == "big" and r.settings["temp"] == 0.2 and r.draft == "small"


def test_existing_file_without_gguf_suffix_is_a_path(registry: Config, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    assert registry.resolve("weights.bin").path == tmp_path / "weights.bin"


def test_flags_overlay_the_models_settings(registry: Config) -> None:
    base = defaults_for("run").merged(registry.resolve("big").settings)
    flags = parse_updates({"temp": "1.1", "top_k": None, "draft_max": "12", "seed": "7"}, FLAGS)
    merged = base.merged(flags)
    assert merged == RunSettings(temp=1.1, top_k=20, ctx=2048, draft_max=12, seed=7)
    assert base.merged(parse_updates({"draft_max": "auto"}, FLAGS)).draft_max == "auto"
    assert base.merged({}) == base


def test_flags_are_checked_by_the_settings_rules() -> None:
    with pytest.raises(KeyError):
        parse_updates({"temperature": "1.0"}, FLAGS)
    with pytest.raises(SettingError, match="--top-p must be a number in"):
        parse_updates({"top_p": "0"}, FLAGS)
    assert parse_updates({"seed": "-1"}, FLAGS) == {"seed": None}  # -1: random, over a seed from a file


def test_every_source_shares_the_rules(tmp_path: Path) -> None:
    """The same value is refused with the same words from a flag, a file and a chat command."""
    from specli.chat.session import SLASH

    with pytest.raises(SettingError) as flag:
        parse_updates({"temp": "-1"}, FLAGS)
    with pytest.raises(SettingError) as slash:
        parse_updates({"temp": "-1"}, SLASH)
    with pytest.raises(SettingError) as file:
        load_config(write(tmp_path / "models.toml", "[defaults]\ntemp = -1\n"))
    assert flag.value.problem == slash.value.problem == file.value.problem
    assert (flag.value.option, slash.value.option, file.value.option) == ("--temp", "/temp", "defaults.temp")
    # models.toml and the flags agree on threads 0 and gpu layers -1
    loaded = load_config(write(tmp_path / "ok.toml", "[defaults]\nthreads = 0\ngpu_layers = -1\n"))
    assert loaded.defaults == parse_updates({"threads": "0", "gpu_layers": "-1"}, FLAGS)


# --------------------------------------------------------------------------------------------------
# `specli models` rows and table
# --------------------------------------------------------------------------------------------------


def test_model_rows_present_missing_invalid(tmp_path: Path) -> None:
    tiny_gguf(tmp_path / "good.gguf")
    (tmp_path / "bad.gguf").write_text("not a model")
    cfg = load_config(write(tmp_path / "models.toml", """
        [models.good]
        path = "good.gguf"
        draft = "bad"
        [models.bad]
        path = "bad.gguf"
        [models.gone]
        path = "gone.gguf"
    """))
    rows = {r["name"]: r for r in model_rows(cfg)}
    good, bad, gone = rows["good"], rows["bad"], rows["gone"]
    assert good["status"] == "present" and good["error"] is None
    described = (good["architecture"], good["vocab_size"], good["context_length"], good["draft"])
    assert described == ("llama", 288, 128, "bad")  # write_gguf: 3 specials, 256 byte tokens, 29 more
    assert good["parameters"] > 0 and good["size"] == (tmp_path / "good.gguf").stat().st_size
    assert bad["status"] == "invalid" and "not a GGUF file" in bad["error"]
    assert gone["status"] == "missing" and gone["size"] is None

    console = Console(record=True, width=200)
    console.print(render_models_table(list(rows.values()), title="models"))
    out = console.export_text()
    for text in ("good", "present", "invalid", "missing", "llama", "not a GGUF file"):
        assert text in out


def test_model_rows_survive_unexpected_parser_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny_gguf(tmp_path / "good.gguf")
    cfg = load_config(write(tmp_path / "models.toml", '[models.good]\npath = "good.gguf"\n'))

    def boom(path: Any) -> Any:
        raise RuntimeError("parser bug")

    import specli.gguf_info

    monkeypatch.setattr(specli.gguf_info, "read_gguf_info", boom)
    (row,) = model_rows(cfg)
    assert row["status"] == "invalid" and "parser bug" in row["error"]


# --------------------------------------------------------------------------------------------------
# the repository's models.toml
# --------------------------------------------------------------------------------------------------


def test_repo_models_toml_loads() -> None:
    cfg = load_config(REPO / "models.toml")
    # No active [defaults]: run from the checkout, every command keeps the defaults its help states.
    assert cfg.defaults == {}
    for name, entry in cfg.models.items():
        assert entry.draft is None or entry.draft in cfg.models, name
        assert entry.path.suffix == ".gguf", name
    for target, draft in (("qwen2-7b", "qwen2-0.5b"), ("qwen2.5-7b", "qwen2.5-0.5b"),
                          ("llama3.1-8b", "llama3.2-1b"), ("demo-target", "demo-draft"),
                          ("stories260k", "stories-draft")):
        assert cfg.models[target].draft == draft
    assert cfg.models["qwen2-7b"].path.name == "qwen2-7b-instruct-q4_k_m.gguf"
    assert cfg.models["qwen2-0.5b"].path.name == "qwen2-0_5b-instruct-q8_0.gguf"
    assert cfg.models["demo-target"].path == REPO / "demo-models" / "specli-demo-target.gguf"
    assert cfg.models["demo-draft"].path == REPO / "demo-models" / "specli-demo-draft.gguf"
    assert cfg.models["stories260k"].path == SHARED_MODELS / "stories260K.gguf"
    assert cfg.models["stories-draft"].path == SHARED_MODELS / "llama2xs-279K-draft.gguf"
    assert all(e.url.startswith("https://huggingface.co/") for e in cfg.models.values() if e.url)
    rows = model_rows(cfg)
    assert len(rows) == len(cfg.models)


@pytest.mark.skipif(not (SHARED_MODELS / "stories260K.gguf").exists(), reason=f"{SHARED_MODELS} not present")
def test_repo_models_toml_dev_pair_resolves() -> None:
    cfg = load_config(REPO / "models.toml")
    r = cfg.resolve("stories260k")
    assert r.path == SHARED_MODELS / "stories260K.gguf" and r.settings["ctx"] == 256
    assert cfg.resolve(r.draft or "").path.name == "llama2xs-279K-draft.gguf"
    rows = {row["name"]: row for row in model_rows(cfg)}
    assert rows["stories260k"]["status"] == "present" and rows["stories260k"]["parameters"] == 292_800


def test_module_exports() -> None:
    assert set(config_mod.__all__) <= set(dir(config_mod))


def test_errors_show_paths_inside_cwd_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "models.toml", "[defaults]\ntemp = -1\n")
    with pytest.raises(SettingError) as exc:
        load_config("models.toml")
    assert str(exc.value) == ("models.toml:2: defaults.temp: must be a finite number >= 0 (0 is greedy), "
                              "got -1")


def test_syntax_error_at_end_of_document(tmp_path: Path) -> None:
    err = config_error(write(tmp_path / "models.toml", '[models.a]\npath = """abc\n'))
    assert err.line is not None and "TOML syntax error" in str(err)
