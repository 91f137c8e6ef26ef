"""Shared fixtures: tiny synthetic GGUF models (built per session, ~0.2 s) and the real trained pair."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from support import SHARED_MODELS_DIR

from specli.synth import FixtureModels, build_fixture_models


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
