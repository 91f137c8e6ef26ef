"""Shared fixtures: tiny synthetic GGUF models (built per session, ~0.2 s) and the real trained pair."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import SHARED_MODELS_DIR

from specli_synth.fixtures import FixtureModels, build_fixture_models
from specli_synth.trained_drafters import TrainedDrafterFiles, write_trained_drafters


def pytest_configure(config: pytest.Config) -> None:
    # A shell starts background jobs with SIGINT ignored, children inherit that, and Python then
    # installs no KeyboardInterrupt handler: the Ctrl-C tests would see the program run on. Handle
    # SIGINT here as Python does, so the programs the tests start have the default disposition.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
def trained_drafters(tmp_path_factory: pytest.TempPathFactory) -> TrainedDrafterFiles:
    """A Qwen3-shaped target (.target) with EAGLE-3, DFlash and DSpark drafters, structured (.eagle3,
    .dflash, .dspark: they predict what the target predicts) and random (.eagle3_random ...), in the
    layouts llama.cpp's converter writes (~1 s)."""
    return write_trained_drafters(tmp_path_factory.mktemp("trained-drafters"))


@pytest.fixture(scope="session")
def shared_models() -> SharedModels:
    """The real trained target/draft pair; skips when ../shared/models is absent."""
    target = SHARED_MODELS_DIR / "stories260K.gguf"
    draft = SHARED_MODELS_DIR / "llama2xs-279K-draft.gguf"
    if not (target.is_file() and draft.is_file()):
        pytest.skip("../shared/models not present (real trained pair only exists on the dev machine)")
    return SharedModels(target=target, draft=draft, directory=SHARED_MODELS_DIR)


# Environment variables through which a user's own setup could reach a test: config lookup, the chat
# history file, debug tracebacks, colour forcing, the cost cache (each test's empty HOME holds its own).
_USER_ENV = (
    "SPECLI_CONFIG", "SPECLI_DEBUG", "SPECLI_API_KEY", "XDG_STATE_HOME", "FORCE_COLOR", "NO_COLOR", "COLUMNS",
    "LINES", "SPECLI_CACHE_DIR", "SPECLI_COST_CACHE", "XDG_CACHE_HOME",
)


def _isolate(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
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


@pytest.fixture(scope="session", autouse=True)
def isolated_session_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The same for session- and module-scoped fixtures, which are set up before a test's own
    environment: a server they start (and every Speculator they close) would otherwise read the
    user's models.toml and write the user's cost cache."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        home = tmp_path_factory.mktemp("session-home")
        _isolate(monkeypatch, home)
        # One build of the C filters for the session and every process it starts (each test's empty
        # HOME would otherwise compile its own; specli/native.py).
        monkeypatch.setenv("SPECLI_NATIVE_DIR", str(tmp_path_factory.mktemp("native")))
        yield home


@pytest.fixture(autouse=True)
def isolated_user_environment(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test runs in an empty directory with an empty HOME, so no models.toml (the repository's
    own, ./models.toml, or the user's ~/.config one), no $SPECLI_CONFIG and no history file of the
    person running the tests can change what a test sees. Yields the temporary home."""
    home = tmp_path_factory.mktemp("home")
    _isolate(monkeypatch, home)
    return home


@pytest.fixture(scope="session")
def eos_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model that ends its text: at every position the same distribution, token 300 at
    logit 3.5, EOS at 3, the rest at 0. Greedy never stops (it repeats token 300); sampling with the CLI's
    filters (min-p 0.05 leaves token 300 and EOS) stops at EOS within a few tokens. The fixture models never
    emit EOS, nor does the real pair within hundreds of tokens."""
    import numpy as np

    from specli_synth.fixtures import FIXTURE_N_VOCAB, fixture_documents
    from specli_synth.gguf_writer import LlamaSpec, write_llama_gguf
    from specli_synth.vocab import train_vocab

    vocab = train_vocab(fixture_documents(), FIXTURE_N_VOCAB).vocab
    spec = LlamaSpec(n_vocab=len(vocab.tokens), n_embd=32, n_layer=1, n_head=2, n_head_kv=2, n_ff=64,
                     name="eos-model")
    weights = {name: np.zeros(shape, np.float32) for name, shape in spec.tensor_shapes().items()}
    for name, shape in spec.tensor_shapes().items():
        if len(shape) == 1:
            weights[name] = np.ones(shape, np.float32)  # norms
    # Zero attention and FFN leave the embedding as the final state; after the norm it is all ones,
    # so a token's logit is the sum of its output row.
    weights["token_embd.weight"][:] = 0.1
    weights["output.weight"][vocab.eos_id] = 3.0 / spec.n_embd
    weights["output.weight"][300] = 3.5 / spec.n_embd
    path = tmp_path_factory.mktemp("eos-model") / "eos-model.gguf"
    return write_llama_gguf(path, spec, vocab, weights, dtype="f32")
