"""Shared fixtures: tiny synthetic GGUF models (built per session, ~0.2 s) and the real trained pair."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from specli.synth import FixtureModels, build_fixture_models

# ../shared/models beside the repository: only on the development machine, never in a user's clone.
SHARED_MODELS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "models"


@dataclass(frozen=True)
class SharedModels:
    """The real trained pair in ../shared/models (512-token TinyStories vocabulary, BOS 1, EOS 2)."""

    target: Path  # stories260K.gguf
    draft: Path  # llama2xs-279K-draft.gguf
    directory: Path


@pytest.fixture(scope="session")
def fixture_models(tmp_path_factory: pytest.TempPathFactory) -> FixtureModels:
    """Tiny synthetic models: .target and .draft share a vocabulary (the draft agrees partly),
    .other_vocab has a different vocabulary of the same size, .target_with_template carries
    tokenizer.chat_template; .vocab is the shared vocabulary."""
    return build_fixture_models(tmp_path_factory.mktemp("fixture-models"))


@pytest.fixture(scope="session")
def shared_models() -> SharedModels:
    """The real trained target/draft pair; skips when ../shared/models is absent."""
    target = SHARED_MODELS_DIR / "stories260K.gguf"
    draft = SHARED_MODELS_DIR / "llama2xs-279K-draft.gguf"
    if not (target.is_file() and draft.is_file()):
        pytest.skip("../shared/models not present (real trained pair only exists on the dev machine)")
    return SharedModels(target=target, draft=draft, directory=SHARED_MODELS_DIR)


# Environment variables through which a user's own setup could reach a test: config lookup, the chat
# history file, debug tracebacks, colour forcing.
_USER_ENV = (
    "SPECLI_CONFIG", "SPECLI_DEBUG", "XDG_STATE_HOME", "FORCE_COLOR", "NO_COLOR", "COLUMNS", "LINES"
)


@pytest.fixture(autouse=True)
def isolated_user_environment(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test runs in an empty directory with an empty HOME, so no models.toml (the repository's
    own, ./models.toml, or the user's ~/.config one), no $SPECLI_CONFIG and no history file of the
    person running the tests can change what a test sees. Yields the temporary home."""
    home = tmp_path_factory.mktemp("home")
    for name in _USER_ENV:
        # setenv first so that monkeypatch restores the variable even when the test sets it itself
        # (`specli --debug` writes SPECLI_DEBUG into os.environ).
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("USERPROFILE", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("APPDATA", str(home / "AppData" / "Roaming"))
    work = home / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return home
