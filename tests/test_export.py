"""`specli export --to llama-server|vllm|sglang`: the command carries every mapped setting, flag names
are the engines' own, the vLLM config is valid JSON, and what cannot carry over is said."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specli.cli import app

runner = CliRunner()

# llama-server's flags as the vendored llama.cpp (llama-cpp-python 0.3.36) spells them in
# common/arg.cpp; the export may use no other.
LLAMA_SERVER_FLAGS = {
    "-m", "-md", "--spec-type", "--spec-draft-n-max", "--spec-draft-p-min", "--spec-ngram-simple-size-n",
    "--spec-ngram-simple-size-m", "-c", "-ngl", "-ngld", "-t", "--temp", "--top-k", "--top-p", "--min-p",
    "--seed", "--ignore-eos", "--host", "--port", "--no-repack",
}
LLAMA_SERVER_SPEC_TYPES = {"none", "draft-simple", "draft-mtp", "ngram-simple"}
# vLLM's `vllm serve` options and speculative-config keys (docs.vllm.ai: serve, SpeculativeConfig).
VLLM_FLAGS = {"--speculative-config", "--max-model-len", "--generation-config",
              "--override-generation-config", "--seed", "--host", "--port"}
VLLM_CONFIG_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
# SGLang's server arguments (docs.sglang.ai: server arguments, speculative decoding).
SGLANG_FLAGS = {"--model-path", "--speculative-algorithm", "--speculative-draft-model-path",
                "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                "--context-length", "--random-seed", "--host", "--port", "--enable-deterministic-inference"}


def export(*args: str) -> dict:
    result = runner.invoke(app, ["export", "--json", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def options(argv: list[str], head: int) -> dict[str, str | None]:
    """Flag -> value (None for a switch) of an argv after its first `head` words."""
    out: dict[str, str | None] = {}
    rest = argv[head:]
    i = 0
    while i < len(rest):
        flag = rest[i]
        assert flag.startswith("-"), f"{flag!r} is not an option in {argv}"
        value = rest[i + 1] if i + 1 < len(rest) and not rest[i + 1].startswith("--") else None
        if value is not None and value.startswith("-") and not value.lstrip("-").replace(".", "").isdigit():
            value = None
        out[flag] = value
        i += 1 if value is None else 2
    return out


def test_llama_server_draft_model_carries_every_setting(fixture_models) -> None:
    out = export("--to", "llama-server", "-m", str(fixture_models.target),
                 "--draft", str(fixture_models.draft), "-k", "5", "--draft-p-min", "0.3", "--temp", "0.7",
                 "--top-k", "20", "--top-p", "0.9",
                 "--min-p", "0.1", "-s", "42", "-c", "1024", "-t", "2", "-ngl", "-1")
    opts = options(out["argv"], 1)
    assert out["argv"][0] == "llama-server" and set(opts) <= LLAMA_SERVER_FLAGS
    assert opts["-m"] == str(fixture_models.target) and opts["-md"] == str(fixture_models.draft)
    # since llama.cpp #23988 -md alone speculates with nothing: the type is always named
    assert opts["--spec-type"] == "draft-simple" and opts["--spec-draft-n-max"] == "5"
    assert opts["--spec-draft-p-min"] == "0.3"
    assert (opts["--temp"], opts["--top-k"], opts["--top-p"], opts["--min-p"]) == ("0.7", "20", "0.9", "0.1")
    assert (opts["--seed"], opts["-c"], opts["-t"], opts["-ngl"], opts["-ngld"]) == ("42", "1024", "2", "all",
                                                                                      "all")
    assert out["k"] == 5 and out["k_source"] == "-k"
    # the printed command is the environment and the argv, quoted for a shell
    env = [f"{name}={value}" for name, value in out["env"].items()]
    assert shlex.split(out["command"].replace("\\\n", " ")) == env + out["argv"]
    notes = " ".join(out["notes"])
    assert "sample-and-match" in notes and "--same-as-plain" in notes


def test_llama_server_ngram_mtp_and_no_draft(fixture_models) -> None:
    ngram = options(export("--to", "llama-server", "-m", str(fixture_models.target), "--draft", "ngram",
                           "-k", "6")["argv"], 1)
    assert ngram["--spec-type"] == "ngram-simple" and "-md" not in ngram
    assert ngram["--spec-ngram-simple-size-m"] == "6" and ngram["--spec-draft-n-max"] == "6"
    combined = options(export("--to", "llama-server", "-m", str(fixture_models.target), "--draft",
                              str(fixture_models.draft), "--ngram", "-k", "3")["argv"], 1)
    assert combined["--spec-type"] == "ngram-simple,draft-simple"
    assert set(combined["--spec-type"].split(",")) <= LLAMA_SERVER_SPEC_TYPES
    mtp = options(export("--to", "llama-server", "-m", str(fixture_models.target), "--draft", "mtp",
                         "-k", "2")["argv"], 1)
    assert mtp["--spec-type"] == "draft-mtp" and "-md" not in mtp
    plain = options(export("--to", "llama-server", "-m", str(fixture_models.target), "--no-draft")["argv"], 1)
    assert plain["--spec-type"] == "none"


def test_vllm_config_is_json_with_its_documented_keys(fixture_models) -> None:
    for draft, method in ((str(fixture_models.draft), "draft_model"), ("ngram", "ngram"), ("mtp", "mtp")):
        out = export("--to", "vllm", "-m", str(fixture_models.target), "--draft", draft, "-k", "3",
                     "--temp", "0", "--top-k", "0", "-s", "7", "-c", "2048")
        argv = out["argv"]
        assert argv[:2] == ["vllm", "serve"]
        opts = options(argv, 3)
        assert set(opts) <= VLLM_FLAGS
        config = json.loads(opts["--speculative-config"])
        assert set(config) <= VLLM_CONFIG_KEYS and config["method"] == method
        assert config["num_speculative_tokens"] == 3
        if method == "ngram":
            assert (config["prompt_lookup_max"], config["prompt_lookup_min"]) == (4, 1)
        generation = json.loads(opts["--override-generation-config"])
        assert generation == {"temperature": 0.0, "top_k": -1, "top_p": 0.95, "min_p": 0.05, "seed": 7}
        assert opts["--max-model-len"] == "2048" and opts["--seed"] == "7"
        assert "Hugging Face" in " ".join(out["notes"])
    assert "HF_TARGET_REPO" in argv
    placeholder = export("--to", "vllm", "-m", str(fixture_models.target),
                         "--draft", str(fixture_models.draft))
    assert json.loads(options(placeholder["argv"], 3)["--speculative-config"])["model"] == "HF_DRAFT_REPO"


def test_sglang_flags(fixture_models) -> None:
    out = export("--to", "sglang", "-m", str(fixture_models.target), "--draft", str(fixture_models.draft),
                 "-k", "4", "-s", "3")
    assert out["argv"][:3] == ["python", "-m", "sglang.launch_server"]
    opts = options(out["argv"], 3)
    assert set(opts) <= SGLANG_FLAGS
    assert opts["--speculative-algorithm"] == "STANDALONE"
    assert (opts["--speculative-num-steps"], opts["--speculative-eagle-topk"],
            opts["--speculative-num-draft-tokens"]) == ("4", "1", "5")
    assert opts["--random-seed"] == "3"
    for draft, algorithm in (("ngram", "NGRAM"), ("mtp", "NEXTN")):
        argv = export("--to", "sglang", "-m", str(fixture_models.target), "--draft", draft)["argv"]
        opts = options(argv, 3)
        assert set(opts) <= SGLANG_FLAGS and opts["--speculative-algorithm"] == algorithm


def test_models_toml_settings_and_hf_repositories(fixture_models, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models.toml").write_text(
        "[defaults]\ntemp = 0.2\n"
        f'[models.tiny]\npath = "{fixture_models.target}"\ndraft = "tinydraft"\nctx = 512\n'
        'hf = "example/tiny-target"\n'
        f'[models.tinydraft]\npath = "{fixture_models.draft}"\nhf = "example/tiny-draft"\n'
    )
    server = options(export("--to", "llama-server", "-m", "tiny", "-k", "2")["argv"], 1)
    assert server["-md"] == str(fixture_models.draft)  # the entry's default draft
    assert (server["-c"], server["--temp"]) == ("512", "0.2")  # its settings and [defaults]
    vllm = export("--to", "vllm", "-m", "tiny", "-k", "2")
    assert vllm["argv"][2] == "example/tiny-target"
    assert json.loads(options(vllm["argv"], 3)["--speculative-config"])["model"] == "example/tiny-draft"
    assert "HF_TARGET_REPO" not in vllm["command"]
    bad_entry = f'[models.tiny]\npath = "{fixture_models.target}"\nhf = "no slash"\n'
    (tmp_path / "models.toml").write_text(bad_entry)
    bad = runner.invoke(app, ["export", "--to", "vllm", "-m", "tiny"])
    assert bad.exit_code == 1 and "models.tiny.hf" in bad.stderr and "OWNER/NAME" in bad.stderr


def _bench_file(path: Path, best_k: object, configs: list[dict]) -> Path:
    path.write_text(json.dumps({"format": 1, "tool": "specli bench",
                                "best": {"temperature": 0.0, "k": best_k, "speedup": 1.4},
                                "configs": configs}))
    return path


def test_k_auto_takes_the_bench_best_or_a_default(fixture_models, tmp_path) -> None:
    common = ("--to", "llama-server", "-m", str(fixture_models.target), "--draft", str(fixture_models.draft))
    default = export(*common)
    assert default["k"] == 4 and default["k_source"] == "default"
    assert any("-k auto" in n and "--from-bench" in n for n in default["notes"])
    best = _bench_file(tmp_path / "b.json", 8, [])
    out = export(*common, "--from-bench", str(best))
    assert out["k"] == 8 and options(out["argv"], 1)["--spec-draft-n-max"] == "8"
    # the overall best was auto: the best fixed k instead
    auto = _bench_file(tmp_path / "a.json", "auto", [
        {"temperature": 0.0, "k": 2, "speedup": {"median": 1.1}},
        {"temperature": 0.0, "k": 6, "speedup": {"median": 1.3}},
        {"temperature": 0.0, "k": "auto", "speedup": {"median": 1.5}}])
    assert export(*common, "--from-bench", str(auto))["k"] == 6


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"),
    ("not json", "not a JSON file written by `specli bench --json`"),
    (json.dumps({"tool": "specli bench", "best": {"k": "auto"}, "configs": []}), "measured no fixed k"),
])
def test_bad_input_is_one_line_and_exit_2(fixture_models, tmp_path, content, message) -> None:
    path = tmp_path / "bench.json"
    if content is not None:
        path.write_text(content)
    result = runner.invoke(app, ["export", "--to", "vllm", "-m", str(fixture_models.target),
                                 "--draft", "ngram", "--from-bench", str(path)])
    assert result.exit_code == 2 and message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_unknown_engine_is_a_usage_error(fixture_models) -> None:
    result = runner.invoke(app, ["export", "--to", "tgi", "-m", str(fixture_models.target)])
    assert result.exit_code == 2 and "llama-server, vllm, sglang" in result.stderr


def test_plain_output_is_the_command_and_notes_go_to_stderr(fixture_models) -> None:
    result = runner.invoke(app, ["export", "--to", "llama-server", "-m", str(fixture_models.target),
                                 "--draft", "ngram", "-k", "3"], catch_exceptions=False)
    assert result.exit_code == 0
    argv = shlex.split(result.stdout.replace("\\\n", " "))
    assert argv[:2] == ["GGML_CPU_TILED_MM=0", "llama-server"] and "--spec-type" in argv
    assert "note:" in result.stderr and "note:" not in result.stdout


def test_from_bench_reads_what_specli_bench_writes(fixture_models, tmp_path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("Once upon a time\n")
    bench_json = tmp_path / "bench.json"
    bench = runner.invoke(app, ["bench", "-m", str(fixture_models.target), "--draft", "ngram", "-k", "1,2",
                                "--temp", "0", "-n", "8", "--repeat", "1", "-t", "1",
                                "--prompts", str(prompts), "--json", str(bench_json)], catch_exceptions=False)
    assert bench.exit_code == 0, bench.output
    best = json.loads(bench_json.read_text())["best"]["k"]
    out = export("--to", "llama-server", "-m", str(fixture_models.target), "--draft", "ngram",
                 "--from-bench", str(bench_json))
    assert out["k"] == best and out["k_source"] == f"--from-bench {bench_json}"


def test_llama_server_loads_without_repacking_on_cpus_with_amx(fixture_models, monkeypatch) -> None:
    """specli does not repack weights on AMX CPUs (llama.cpp's AMX kernels crash on some Xeons); the
    exported command must not crash where specli runs."""
    import specli.export

    for amx in (True, False):
        monkeypatch.setattr(specli.export, "cpu_has_amx", lambda amx=amx: amx)
        out = export("--to", "llama-server", "-m", str(fixture_models.target), "--draft", "ngram",
                     "--no-batch-invariant")
        assert ("--no-repack" in out["argv"]) is amx
        assert any("AMX" in note for note in out["notes"]) is amx
        # Batch-invariant arithmetic (the default) never repacks.
        out = export("--to", "llama-server", "-m", str(fixture_models.target), "--draft", "ngram")
        assert "--no-repack" in out["argv"]


def test_batch_invariant_arithmetic_carries_over_where_the_engines_have_it(fixture_models) -> None:
    """specli's default --batch-invariant: llama-server without the tiled K-quant matmul (an environment
    variable), repacking or an F16 cache on the CPU; vLLM's VLLM_BATCH_INVARIANT; SGLang's deterministic
    mode. --no-batch-invariant: none of it."""
    target = str(fixture_models.target)
    server = export("--to", "llama-server", "-m", target, "--draft", "ngram")
    assert server["env"] == {"GGML_CPU_TILED_MM": "0"}
    assert server["command"].startswith("GGML_CPU_TILED_MM=0 llama-server ")
    opts = options(server["argv"], 1)
    assert (opts["-ctk"], opts["-ctv"]) == ("bf16", "bf16") and "--no-repack" in server["argv"]
    on_gpu = export("--to", "llama-server", "-m", target, "--draft", "ngram", "-ngl", "99")
    assert "-ctk" not in on_gpu["argv"]  # a GPU's attention is its own: llama.cpp's default cache there
    assert export("--to", "vllm", "-m", target, "--draft", "ngram")["env"] == {"VLLM_BATCH_INVARIANT": "1"}
    sglang = export("--to", "sglang", "-m", target, "--draft", "ngram")
    assert "--enable-deterministic-inference" in sglang["argv"]
    for engine in ("llama-server", "vllm", "sglang"):
        off = export("--to", engine, "-m", target, "--draft", "ngram", "--no-batch-invariant")
        assert off["env"] == {} and "-ctk" not in off["argv"]
        assert "--enable-deterministic-inference" not in off["argv"]
