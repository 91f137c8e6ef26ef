"""Bad input, limits and interruption, through the installed `specli` in a subprocess.

A subprocess, because what these tests guard against includes llama.cpp aborting the whole process
on a malformed file: that must fail a test, not kill the test run. Each class of failure has a test
with several instances, so that the class (not just the case first reported) stays fixed. Nothing
here waits on the clock: interrupts are sent after a marker the program printed, or injected at a
counted llama.cpp call.
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import zlib
from dataclasses import replace
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest
from support import (
    EXE,
    TIMEOUT,
    _env,
    assert_one_line_error,
    specli,
    specli_on_terminal,
    write_config,
    write_gguf,
)

from specli import GenerationParams, SamplingParams, TokenEvent, host, load
from specli import llama as specli_llama
from specli.gguf_info import read_gguf_info
from specli_synth.fixtures import FIXTURE_TARGET, fixture_vocab
from specli_synth.ngram_model import write_ngram_model
from specli_synth.vocab import Vocab

PROMPT = "Once upon a time"


def start_specli(*args: str, cwd: Path, stdin=None) -> subprocess.Popen:
    """`specli run` in the background, long enough to be interrupted: 1 thread, no EOS, a big context."""
    return subprocess.Popen(
        [EXE, "run", *args, "-c", "16384", "--ignore-eos", "-t", "1"],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=_env(cwd),
    )


# -- model files that must never reach llama.cpp ----------------------------------------------------


def header_edit(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    """Copy `src`, replacing `old` by `new` (same length) in the GGUF header only: offsets stay valid."""
    assert len(old) == len(new)
    data = src.read_bytes()
    end = read_gguf_info(src).data_offset
    assert old in data[:end]
    dst.write_bytes(data[:end].replace(old, new) + data[end:])
    return dst


def metadata_edit(src: Path, dst: Path, key: str, value: float) -> Path:
    """Copy `src` with the float32 metadata `key` set to `value` (in place: offsets stay valid)."""
    data = bytearray(src.read_bytes())
    needle = struct.pack("<Q", len(key)) + key.encode()
    at = data.index(needle) + len(needle)
    assert struct.unpack_from("<I", data, at)[0] == 6, "not a float32"  # GGUF value type float32
    struct.pack_into("<f", data, at + 4, value)
    dst.write_bytes(bytes(data))
    return dst


def _bad_file(kind: str, tmp: Path, good: Path) -> Path | str:
    if kind == "missing":
        return tmp / "absent.gguf"
    if kind == "directory":
        (tmp / "dir.gguf").mkdir()
        return tmp / "dir.gguf"
    if kind == "not gguf":
        (tmp / "notes.gguf").write_text("hello, this is not a model\n")
        return tmp / "notes.gguf"
    if kind == "truncated":
        data = good.read_bytes()
        (tmp / "cut.gguf").write_bytes(data[: len(data) * 2 // 3])
        return tmp / "cut.gguf"
    if kind == "heads":
        return write_gguf(tmp / "heads.gguf", n_head=5, n_head_kv=5)
    if kind == "architecture":
        return write_gguf(tmp / "arch.gguf", arch="foo")
    if kind == "byte tokens":  # an SPM vocabulary whose <0xNN> tokens were renamed: llama.cpp aborts
        return header_edit(good, tmp / "nobytes.gguf", b"<0x", b"<1x")
    if kind == "newline token":  # only the byte token for "\n" is gone
        return header_edit(good, tmp / "nonl.gguf", b"<0x0A>", b"<0x0a>")
    if kind in ("eps nan", "eps negative", "eps infinite"):  # NaN and -1: GGML_ASSERT(eps >= 0), exit 134
        value = {"eps nan": math.nan, "eps negative": -1.0, "eps infinite": math.inf}[kind]
        return metadata_edit(good, tmp / "eps.gguf", "llama.attention.layer_norm_rms_epsilon", value)
    if kind == "rope base":  # every logit NaN
        return metadata_edit(good, tmp / "rope.gguf", "llama.rope.freq_base", 0.0)
    if kind == "fifo":  # opening it for reading blocks until a writer comes: forever
        os.mkfifo(tmp / "pipe.gguf")
        return tmp / "pipe.gguf"
    if kind == "device":
        return "/dev/zero"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind, fragment",
    [
        ("missing", "no such file"),
        ("directory", "directory"),
        ("not gguf", "not a GGUF file"),
        ("truncated", "truncated"),
        ("heads", "does not divide"),
        ("architecture", "not supported"),
        ("byte tokens", "the SPM vocabulary lacks byte tokens for"),
        ("newline token", "lacks byte tokens for 1 of the 256"),
        ("eps nan", "layer_norm_rms_epsilon is nan, not a finite number"),
        ("eps negative", "llama.cpp needs an epsilon >= 0"),
        ("eps infinite", "layer_norm_rms_epsilon is inf, not a finite number"),
        ("rope base", "llama.rope.freq_base is 0, not a positive number"),
        ("fifo", "named pipe (FIFO), not a regular file"),
        ("device", "character device, not a regular file"),
    ],
)
@pytest.mark.parametrize("role", ["target", "draft"])
def test_bad_model_files_are_refused_before_llama_cpp(fixture_models, tmp_path, kind, fragment, role) -> None:
    bad = _bad_file(kind, tmp_path, fixture_models.target)
    target, draft = (bad, fixture_models.draft) if role == "target" else (fixture_models.target, bad)
    proc = specli(
        "run", "--target", str(target), "--draft", str(draft), PROMPT, "-n", "4", "-t", "1", cwd=tmp_path
    )
    assert_one_line_error(proc, 1, fragment)
    assert "re-download" not in proc.stderr or kind == "truncated"


@pytest.mark.parametrize("kind", ["byte tokens", "fifo", "device"])
def test_every_front_end_refuses_unusable_model_files(fixture_models, tmp_path, kind) -> None:
    """`models` lists the file as invalid (it does not call it fine), and `models check`, `chat` and
    `bench` refuse it in one line; none of them blocks on a FIFO."""
    bad = _bad_file(kind, tmp_path, fixture_models.target)
    config = write_config(
        tmp_path, f'[models.bad]\npath = "{bad}"\n[models.good]\npath = "{fixture_models.target}"\n'
    )
    listing = specli("models", "--json", "--config", str(config), cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    rows = {row["name"]: row for row in json.loads(listing.stdout)}
    assert rows["bad"]["status"] == "invalid" and rows["good"]["status"] == "present"
    check = specli("models", "check", str(fixture_models.target), str(bad), cwd=tmp_path)
    assert_one_line_error(check, 1)
    check = specli("models", "check", "bad", "good", "--config", str(config), cwd=tmp_path)
    assert_one_line_error(check, 1)
    chat = specli("chat", "--target", str(bad), "--no-history", cwd=tmp_path, input="hello\n")
    assert_one_line_error(chat, 1)
    bench = specli(
        "bench", "--target", str(bad), "--draft", "ngram", "-n", "2", "--repeat", "1", cwd=tmp_path
    )
    assert_one_line_error(bench, 1)


def test_real_model_without_byte_tokens_is_refused(shared_models, tmp_path) -> None:
    """The case reported: stories260K with its byte tokens renamed passed validation, then llama.cpp
    aborted (exit 134, a C++ backtrace on stdout) on the first prompt needing a byte token."""
    bad = header_edit(shared_models.target, tmp_path / "stories-nobytes.gguf", b"<0x", b"<1x")
    for args in (["run", "--target", str(bad), "Zebra ñ 🦊", "-n", "4", "-t", "1"],
                 ["chat", "--target", str(bad), "--no-history"]):
        proc = specli(*args, cwd=tmp_path, input="Zebra ñ 🦊\n")
        assert_one_line_error(proc, 1, "byte tokens")
        assert "terminate" not in proc.stdout + proc.stderr


def _vocab_with_extra_tokens(n_extra: int) -> Vocab:
    base = fixture_vocab().vocab
    extra = tuple(f"extra{i}" for i in range(n_extra))
    return replace(base, tokens=base.tokens + extra, scores=base.scores + (-1000.0,) * n_extra,
                   token_types=base.token_types + (1,) * n_extra)


def test_vocabulary_size_mismatch_is_refused_up_front(fixture_models, tmp_path) -> None:
    """A target with 64 real tokens more than its draft (same texts otherwise) passed `models check`
    and died mid-run with `llama_decode failed` once the draft was fed one of them."""
    trained = fixture_vocab()
    bigger = write_ngram_model(tmp_path / "bigger.gguf", replace(trained, vocab=_vocab_with_extra_tokens(64)),
                               FIXTURE_TARGET, dtype="f32")
    check = specli("models", "check", str(bigger), str(fixture_models.draft), cwd=tmp_path)
    assert check.returncode == 1 and "incompatible" in check.stdout and "does not know" in check.stdout
    for extra in ([], ["--json"], ["--temp", "1.5", "--top-k", "0", "--min-p", "0", "--top-p", "1"]):
        proc = specli("run", "--target", str(bigger), "--draft", str(fixture_models.draft), PROMPT,
                      "-n", "64", "-t", "1", *extra, cwd=tmp_path)
        assert_one_line_error(proc, 1, "cannot draft for", "the target has 64 tokens the draft does not know")
        assert proc.stdout == ""
    # The other way round works: the draft's extra ids are never proposed (the target has no such ids).
    proc = specli("run", "--target", str(fixture_models.draft), "--draft", str(bigger), PROMPT,
                  "-n", "16", "-t", "1", "--ignore-eos", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stats"]["generated_tokens"] == 16


def test_different_vocabularies(fixture_models, tmp_path) -> None:
    proc = specli(
        "run",
        "--target",
        str(fixture_models.target),
        "--draft",
        str(fixture_models.other_vocab),
        PROMPT,
        "-t",
        "1",
        cwd=tmp_path,
    )
    assert_one_line_error(proc, 1, "cannot draft for", "token")


def test_draft_equal_to_target_is_allowed_with_a_notice(fixture_models, tmp_path) -> None:
    proc = specli(
        "run",
        "--target",
        str(fixture_models.target),
        "--draft",
        str(fixture_models.target),
        PROMPT,
        "-n",
        "8",
        "-k",
        "3",  # auto would rightly not draft with a draft as dear as the target
        "--temp",
        "0",
        "-t",
        "1",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "cannot be faster" in proc.stderr
    assert json.loads(proc.stdout)["stats"]["acceptance_rate"] == 1.0


def test_nan_logits_give_a_clear_error(fixture_models, tmp_path) -> None:
    poisoned = tmp_path / "nan.gguf"
    shutil.copy(fixture_models.target, poisoned)
    reader = gguf.GGUFReader(poisoned, "r+")
    output = next(t for t in reader.tensors if t.name == "output.weight")
    output.data[...] = np.nan
    del reader
    # With a drafter, so that no note ("decoding plainly") precedes the error.
    proc = specli("run", "--target", str(poisoned), PROMPT, "-n", "4", "-t", "1", "--draft", "ngram",
                  cwd=tmp_path)
    assert_one_line_error(proc, 1, "NaN")


# -- prompts and context limits ---------------------------------------------------------------------


def test_empty_prompt(fixture_models, tmp_path) -> None:
    proc = specli("run", "--target", str(fixture_models.target), "-", cwd=tmp_path, input="\n  \n")
    assert_one_line_error(proc, 2, "prompt is empty")


def test_prompt_longer_than_the_context(fixture_models, tmp_path) -> None:
    proc = specli(
        "run",
        "--target",
        str(fixture_models.target),
        "-",
        "-c",
        "256",
        "-t",
        "1",
        cwd=tmp_path,
        input="once upon a time " * 400,
    )
    assert_one_line_error(proc, 2, "context holds", "--ctx")


def test_max_tokens_beyond_the_context_stops_with_a_notice(fixture_models, tmp_path) -> None:
    proc = specli(
        "run",
        "--target",
        str(fixture_models.target),
        "--draft",
        str(fixture_models.draft),
        PROMPT,
        "-n",
        "5000",
        "-c",
        "256",
        "--ignore-eos",
        "--temp",
        "0",
        "-t",
        "1",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["stats"]["stop_reason"] == "context"
    # Every evaluated position fits; the last token is sampled from the last position's logits and
    # never needs evaluating itself.
    assert out["prompt_tokens"] + len(out["tokens"]) == 256 + 1
    assert "context" in proc.stderr and "--ctx" in proc.stderr


@pytest.mark.parametrize("k", [3, 8])
def test_context_exhausted_mid_round_keeps_caches_consistent(fixture_models, k) -> None:
    greedy = SamplingParams(temperature=0.0)
    with load(fixture_models.target, None, n_ctx=256, n_threads=1) as plain:
        events = list(
            plain.generate(PROMPT, GenerationParams(max_tokens=1000, sampling=greedy, ignore_eos=True))
        )
        expected = [e.token for e in events if isinstance(e, TokenEvent)]
    with load(fixture_models.target, fixture_models.draft, n_ctx=256, n_threads=1) as spec:
        params = GenerationParams(max_tokens=1000, sampling=greedy, draft_max=k, ignore_eos=True)
        generation = spec.generate(PROMPT, params)
        events = list(generation)
        got = [e.token for e in events if isinstance(e, TokenEvent)]
        assert events[-1].stop_reason == "context"
        assert spec.target.tokens == generation.context[:-1]
        assert len(generation.context) <= spec.target.n_ctx + 1
        drafter_model = spec.drafter.model
        assert drafter_model.tokens == generation.context[: drafter_model.n_past]
    assert got == expected


# -- options: one layer, one error format, one exit code for every front end ------------------------


BAD_OPTIONS = [
    (["--temp", "-0.5"], "--temp"),
    (["--temp", "1e-40"], "--temp must be 0 (greedy) or at least"),
    (["--temp", "nan"], "--temp"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.01"], "--top-p"),
    (["--min-p", "2"], "--min-p"),
    (["-k", "-1"], "--draft-max"),
    (["-k", "65"], "--draft-max"),
    (["-t", "-1"], "--threads"),
    (["-t", "513"], "--threads must be a whole number from 0 to 512"),
    (["-t", "70000"], "--threads"),  # SIGSEGV in llama.cpp
    (["-t", "2147483648"], "--threads"),  # wrapped around
    (["-ngl", "-2"], "--gpu-layers"),
    (["-ngl", "2147483648"], "--gpu-layers"),
    (["-n", "0"], "--max-tokens"),
    (["-s", "-2"], "--seed"),
    (["-s", "4294967296"], "--seed"),
    (["-c", "8"], "--ctx"),
    (["-c", "4294967296"], "--ctx"),
    (["--no-draft", "--draft", "ngram"], "contradict"),
    (["--ngram"], "--ngram adds n-gram lookup to a draft model"),
    (["--draft", "ngram", "--ngram"], "--ngram adds n-gram lookup to a draft model"),
    (["--frobnicate"], "No such option"),
    (["--target", ""], "the target (--target) is empty"),  # was ". is a directory"
    (["--draft", ""], "the draft (--draft) is empty"),
    (["--config", ""], "--config was given an empty file name"),
    (["--stop", ""], "--stop must not be empty"),  # was silently ignored
    (["--top-p", "nan"], "--top-p must be a number in (0, 1] (1: off), got nan"),  # was "should be <= 1"
]


@pytest.mark.parametrize("args, fragment", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_options_are_one_line_usage_errors(fixture_models, tmp_path, args, fragment) -> None:
    proc = specli("run", "--target", str(fixture_models.target), PROMPT, *args, cwd=tmp_path)
    assert_one_line_error(proc, 2, fragment)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--top-p", "0"], "--top-p"),
        (["--temp", "0,1e-40"], "--temp"),
        (["--temp", "-1"], "--temp"),
        (["-n", "0"], "--max-tokens"),
        (["-c", "4294967296"], "--ctx"),
        (["-s", "-2"], "--seed"),
        (["--draft", "ngram", "--ngram"], "--ngram"),
        (["--json", "/missing/dir/b.json"], "does not exist"),
        (["--csv", "."], "is a directory"),
        (["--csv", ""], "--csv was given an empty file name"),
        (["--prompts", ""], "--prompts was given an empty file name"),
    ],
)
def test_bench_options_exit_2_like_run(fixture_models, tmp_path, args, fragment) -> None:
    if "--draft" not in args:
        args = ["--draft", str(fixture_models.draft), *args]
    proc = specli("bench", "--target", str(fixture_models.target), "-n", "2", "--repeat", "1", "-k", "1",
                  *args, cwd=tmp_path)
    assert_one_line_error(proc, 2, fragment)
    assert proc.stdout == ""  # refused before any measuring


@pytest.mark.parametrize(
    "args, fragment",
    [(["--temp", "1e-40"], "--temp"), (["--top-p", "0"], "--top-p"), (["-s", "-5"], "--seed"),
     (["--ngram"], "--ngram"), (["-n", "0"], "--max-tokens")],
)
def test_chat_options_exit_2_like_run(fixture_models, tmp_path, args, fragment) -> None:
    proc = specli(
        "chat", "--target", str(fixture_models.target), "--no-history", *args, cwd=tmp_path, input="hi\n"
    )
    assert_one_line_error(proc, 2, fragment)


def test_thread_counts_are_bounded_by_the_machine(fixture_models, tmp_path) -> None:
    """Within ggml's 512, far more threads than cores is a hang in all but name (-t 5000 took 35 s for
    a few tokens of a tiny model): refused beyond THREADS_PER_CORE per usable core, named where it was
    set; the API refuses what llama.cpp cannot take."""
    from specli.settings import thread_limit

    too_many = str(thread_limit() + 1)
    if thread_limit() < 512:
        proc = specli("run", "--target", str(fixture_models.target), PROMPT, "-t", too_many, cwd=tmp_path)
        assert_one_line_error(proc, 2, f"--threads: {too_many} threads on", "(0: one per core)")
        config = write_config(tmp_path, f'[defaults]\nthreads = {too_many}\n')
        proc = specli("bench", "--target", str(fixture_models.target), "--draft", "ngram", "--config",
                      str(config), cwd=tmp_path)
        assert_one_line_error(proc, 2, f"threads in {config}: {too_many} threads on")
    proc = specli("run", "--target", str(fixture_models.target), PROMPT, "-t", str(thread_limit()), "-n", "2",
                  "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # the limit itself is fine
    for threads in (513, 70000):
        with pytest.raises(specli_llama.LlamaError, match="threads: llama.cpp takes 0"):
            load(fixture_models.target, None, n_ctx=256, n_threads=threads)


def test_models_toml_values_get_the_same_checks(fixture_models, tmp_path) -> None:
    config = write_config(tmp_path, f'[models.t]\npath = "{fixture_models.target}"\ntemp = 1e-40\n')
    proc = specli("run", "--target", "t", PROMPT, "--config", str(config), cwd=tmp_path)
    # Named as it is written there (file, line, key), not as a flag the user did not type.
    assert_one_line_error(proc, 2, "models.toml:3: models.t.temp: must be 0 (greedy) or at least")


def test_a_bad_models_toml_value_stops_only_what_uses_it(fixture_models, tmp_path) -> None:
    """`temp = 1e-30` in the file blocked `bench`, which uses its own --temp list: the command that
    would use the value refuses it (exit 2, file:line: key), the others say they ignore it."""
    config = write_config(tmp_path, f'[defaults]\ntemp = 1e-30\n[models.t]\npath = "{fixture_models.target}"'
                                    f'\n[models.d]\npath = "{fixture_models.draft}"\n')
    where = "models.toml:2: defaults.temp: must be 0 (greedy) or at least"
    run = specli("run", "--target", "t", PROMPT, "-n", "2", "-t", "1", cwd=tmp_path)
    assert_one_line_error(run, 2, where)
    overridden = specli("run", "--target", "t", PROMPT, "-n", "2", "-t", "1", "--temp", "0", cwd=tmp_path)
    assert overridden.returncode == 0 and f"note: ignoring {where}" in overridden.stderr
    assert "(overridden by --temp)" in overridden.stderr
    bench = specli("bench", "--target", "t", "--draft", "d", "-n", "2", "--repeat", "1", "-k", "1",
                   "--temp", "0", "-t", "1", cwd=tmp_path)
    assert bench.returncode == 0, bench.stderr
    assert "(bench does not use it)" in bench.stderr and "speedup" in bench.stdout
    listing = specli("models", "--json", "--config", str(config), cwd=tmp_path)
    assert listing.returncode == 0 and len(json.loads(listing.stdout)) == 2 and where in listing.stderr
    with_k = write_config(tmp_path / "k", f'[models.t]\npath = "{fixture_models.target}"\ndraft_max = 99\n')
    bench = specli("bench", "--target", "t", "--draft", "ngram", "-n", "2", "--repeat", "1", "-k", "1",
                   "--temp", "0", "-t", "1", "--config", str(with_k), cwd=tmp_path)
    assert bench.returncode == 0 and "models.t.draft_max" in bench.stderr, bench.stderr


def test_a_registry_name_that_is_also_a_file_here_is_ambiguous(fixture_models, tmp_path) -> None:
    """A file named like a registry entry in the current directory silently won over the registry."""
    write_config(tmp_path, f'[models.tiny]\npath = "{fixture_models.target}"\n')
    shutil.copy(fixture_models.draft, tmp_path / "tiny")
    proc = specli("run", "--target", "tiny", PROMPT, "-n", "2", "-t", "1", cwd=tmp_path)
    assert_one_line_error(proc, 2, "'tiny' is both a model in models.toml and a file here", "./tiny")
    for target in ("./tiny", str(fixture_models.target)):
        proc = specli("run", "--target", target, PROMPT, "-n", "2", "-t", "1", "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("foreign", ['[tool.other]\nname = "x"\n', "not = toml = at all\n",
                                     '[models.m]\nweights = "m.bin"\n'])
def test_another_tools_models_toml_here_does_not_block_paths(fixture_models, tmp_path, foreign) -> None:
    """A models.toml of another schema in the current directory blocked a run that named only paths:
    it is ignored with a note. It still counts where a name must be looked up, or given by --config."""
    config = write_config(tmp_path, foreign)
    paths = ["--target", str(fixture_models.target), "--draft", str(fixture_models.draft)]
    proc = specli("run", *paths, PROMPT, "-n", "2", "-t", "1", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "note: ignoring models.toml:" in proc.stderr
    check = specli("models", "check", str(fixture_models.target), str(fixture_models.draft), cwd=tmp_path)
    assert check.returncode == 0 and "compatible" in check.stdout, check.stderr
    for args in (["--target", "m", PROMPT], [*paths, PROMPT, "--config", str(config)]):
        proc = specli("run", *args, "-n", "2", "-t", "1", cwd=tmp_path)
        assert_one_line_error(proc, 1, "models.toml")


def test_bench_pair_seeds_stay_seeds_run_takes(fixture_models, tmp_path) -> None:
    """`bench -s 4294967295 --repeat 2` gave the second pair seed 4294967296, which `run` refuses, so
    that pair could not be reproduced: seeds wrap within the seed range, and each pair's output is
    what `run --seed` prints."""
    prompts = tmp_path / "p.txt"
    prompts.write_text(PROMPT + "\n")
    out = tmp_path / "b.json"
    proc = specli("bench", "--target", str(fixture_models.target), "--draft", str(fixture_models.draft),
                  "--prompts", str(prompts), "-s", "4294967295", "--repeat", "2", "-k", "2", "--temp", "0.8",
                  "-n", "8", "-t", "1", "--json", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(out.read_text())["runs"]
    assert sorted({r["seed"] for r in runs}) == [0, 4294967295]
    for seed in (0, 4294967295):
        again = specli("run", "--target", str(fixture_models.target), "--no-draft", PROMPT, "-s", str(seed),
                       "--temp", "0.8", "-n", "8", "--ignore-eos", "-t", "1", "--json", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        tokens = json.loads(again.stdout)["tokens"]
        crc = zlib.crc32(np.asarray(tokens, dtype=np.int64).tobytes())
        assert {r["output_crc"] for r in runs if r["seed"] == seed} == {crc}, seed


def test_seed_minus_one_is_random(fixture_models, tmp_path) -> None:
    """llama.cpp users type -s -1 for a random seed; it used to be a runtime error (exit 1)."""
    seeds = set()
    for _ in range(2):
        proc = specli("run", "--target", str(fixture_models.target), PROMPT, "-n", "4", "-t", "1", "-s", "-1",
                      "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        seeds.add(json.loads(proc.stdout)["seed"])
    assert all(0 <= s < 2**32 for s in seeds)


def test_context_size_is_what_you_get_or_refused(fixture_models, tmp_path) -> None:
    # llama.cpp rounds up to a multiple of 256: said, not silent
    proc = specli("run", "--target", str(fixture_models.target), PROMPT, "-n", "4", "-t", "1", "-c", "16",
                  "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "the context is 256 tokens (asked for 16" in proc.stderr
    # A context whose KV cache cannot fit in memory is refused before it is allocated.
    proc = specli("run", "--target", str(fixture_models.target), PROMPT, "-n", "4", "-t", "1",
                  "-c", str(specli_llama.MAX_CONTEXT), cwd=tmp_path)
    assert_one_line_error(proc, 1, "for its KV cache", "lower --ctx")


def test_kv_cache_estimate_is_checked_against_memory(fixture_models, monkeypatch) -> None:
    with load(fixture_models.target, None, n_ctx=256, n_threads=1) as spec:
        per_token = spec.target.kv_bytes_per_token()
    assert per_token > 0
    monkeypatch.setattr(host, "available_memory", lambda: 4096 * per_token)
    with load(fixture_models.target, None, n_ctx=4096, n_threads=1) as spec:
        assert spec.target.n_ctx == 4096
    with pytest.raises(specli_llama.LlamaError, match="at most about 4096 here"):
        load(fixture_models.target, None, n_ctx=4097, n_threads=1)


def test_empty_and_unprintable_names_are_said_as_such(fixture_models, tmp_path) -> None:
    """An empty model name became the path '.' ("is a directory"); a name with a newline or escape codes
    broke the one line, or drove the terminal."""
    for args in (["models", "check", "", str(fixture_models.target)], ["chat", "", "--no-history"],
                 ["chat", "--target", "", "--no-history"]):
        proc = specli(*args, cwd=tmp_path, input="hi\n")
        assert_one_line_error(proc, 2, "is empty: give a .gguf path or a models.toml name")
    proc = specli("run", "--target", "a\nb\x1b[31m.gguf", PROMPT, cwd=tmp_path)
    assert_one_line_error(proc, 1, "a\\nb\\x1b[31m.gguf: no such file")


def test_usage_errors_of_the_parser_are_one_line(fixture_models, tmp_path) -> None:
    for args in (["run"], ["run", PROMPT], ["bench"], ["models", "check", "x"], ["frobnicate"]):
        proc = specli(*args, cwd=tmp_path)
        assert_one_line_error(proc, 2)


# -- text from the user, a file or a model is shown as text, never as rich markup ----------------------

MARKUP = ["Hello [/] world", "[italic]cat[/italic] :heart:", "a[/]b [bold]x", "[link=file:///x]y"]


@pytest.mark.parametrize("text", MARKUP)
def test_prompts_are_shown_verbatim_on_a_terminal(fixture_models, tmp_path, text) -> None:
    rc, out, err = specli_on_terminal("run", "--target", str(fixture_models.target), "--draft",
                                      str(fixture_models.draft), text, "-n", "4", "-t", "1", cwd=tmp_path)
    assert rc == 0, err
    assert "Traceback" not in out + err
    plain = _strip_ansi(out)
    assert text in plain and "❤" not in plain


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", text).replace("\r", "")


def test_file_and_model_names_are_shown_verbatim(fixture_models, tmp_path) -> None:
    odd = tmp_path / "odd[" / "]names"
    odd.mkdir(parents=True)
    target = odd / "[red]t :heart:.gguf"
    shutil.copy(fixture_models.target, target)
    config = write_config(odd, f'[models."[bold]x[i]"]\npath = "{target}"\n', name="m[bold].toml")
    proc = specli("models", "--config", str(config), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[bold]x[i]" in proc.stdout and "m[bold].toml" in proc.stdout and ":heart:" in proc.stdout
    proc = specli("models", "check", str(target), str(target), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[red]t :heart:.gguf" in proc.stdout
    rc, out, err = specli_on_terminal("run", "--target", str(target), "--draft", str(target), PROMPT,
                                      "-n", "4", "-t", "1", "-k", "2", cwd=tmp_path)
    assert rc == 0, err
    assert "[red]t :heart:.gguf" in _strip_ansi(out) and "Traceback" not in err


def test_bench_prompt_names_are_shown_verbatim(fixture_models, tmp_path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"name": "a[/]b", "prompt": PROMPT}) + "\n"
                       + json.dumps({"name": "[bold]c :heart:", "prompt": "The bird"}) + "\n")
    proc = specli("bench", "--target", str(fixture_models.target), "--draft", str(fixture_models.draft),
                  "--prompts", str(prompts), "-n", "3", "--repeat", "1", "-k", "1", "--temp", "0", "-t", "1",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "a[/]b" in proc.stdout and "[bold]c :heart:" in proc.stdout


# -- outputs: checked before the work, written atomically, the report never lost ----------------------


def _bench(fixture_models, tmp_path, *args: str) -> subprocess.CompletedProcess:
    return specli("bench", "--target", str(fixture_models.target), "--draft", str(fixture_models.draft),
                  "-n", "3", "--repeat", "1", "-k", "1", "--temp", "0", "-t", "1", *args, cwd=tmp_path)


def test_bench_files_are_written_whole(fixture_models, tmp_path) -> None:
    (tmp_path / "b.json").write_text("old")
    proc = _bench(fixture_models, tmp_path, "--json", "b.json", "--csv", "b.csv")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "b.json").read_text())["runs"]
    assert (tmp_path / "b.csv").read_text().startswith("seq,")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp files left


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_bench_report_survives_a_failed_write(fixture_models, tmp_path) -> None:
    """A write that fails after the work (here: no space left) costs the file, not the results."""
    proc = _bench(fixture_models, tmp_path, "--json", "/dev/full")
    assert_one_line_error(proc, 1, "cannot write /dev/full", "the report above has the results")
    assert "speedup" in proc.stdout


@pytest.mark.parametrize("target", ["/missing/dir/t.json", ".", "{tmp}/file/t.json"])
def test_chat_save_failures_are_errors_in_a_script(fixture_models, tmp_path, target) -> None:
    (tmp_path / "file").write_text("")
    target = target.format(tmp=tmp_path)
    proc = specli("chat", "--target", str(fixture_models.target), "--no-history", "-n", "4", "-t", "1",
                  cwd=tmp_path, input=f"Once upon a time\n/save {target}\n")
    assert proc.returncode == 1, proc.stderr
    assert "cannot write" in proc.stderr


# -- chat keeps everything the user said ----------------------------------------------------------------


def test_chat_save_keeps_turns_dropped_from_the_context(fixture_models, tmp_path) -> None:
    lines = [f"Tell me story number {i} about the fox and the bird" for i in range(25)]
    save = tmp_path / "t.json"
    proc = specli("chat", "--target", str(fixture_models.target), "--no-history", "-n", "12", "-c", "256",
                  "--temp", "0", "-t", "1", cwd=tmp_path, input="\n".join([*lines, f"/save {save}"]) + "\n")
    assert proc.returncode == 0, proc.stderr
    assert "to fit the context" in proc.stderr  # turns were dropped from the context ...
    data = json.loads(save.read_text())
    users = [m["content"] for m in data["messages"] if m["role"] == "user"]
    assert users == lines  # ... but not from the transcript
    assert len(data["turns"]) == 25 and data["dropped_from_context"] > 0


def test_chat_eof_inside_a_block_is_said(fixture_models, tmp_path) -> None:
    save = tmp_path / "t.json"
    proc = specli("chat", "--target", str(fixture_models.target), "--no-history", "-n", "4", "-t", "1",
                  cwd=tmp_path, input=f'/save {save}\n"""\nOnce upon a time\nthere was')
    assert proc.returncode == 1
    assert 'end of input inside a """ block' in proc.stderr


@pytest.mark.parametrize("command", ["/temp 1e-40", "/temp -1", "/temp inf"])
def test_chat_slash_commands_use_the_option_rules(fixture_models, tmp_path, command) -> None:
    proc = specli("chat", "--target", str(fixture_models.target), "--no-history", "-n", "4", "-t", "1",
                  cwd=tmp_path, input=f"{command}\n/temp\n")
    assert proc.returncode == 0, proc.stderr
    assert "/temp must be" in proc.stderr and "temperature = 0.8" in proc.stderr


# -- messages say what is wrong ---------------------------------------------------------------------------


def test_invalid_utf8_input_is_named(fixture_models, tmp_path) -> None:
    proc = specli("run", "--target", str(fixture_models.target), b"caf\xe9 au lait", "-n", "2", cwd=tmp_path)
    assert_one_line_error(proc, 2, "the prompt is not valid UTF-8", "e9")
    proc = specli("run", "--target", str(fixture_models.target), "-", "-n", "2", cwd=tmp_path,
                  input=b"caf\xe9 au lait\n")
    assert_one_line_error(proc, 2, "the prompt on stdin is not valid UTF-8", "e9")
    proc = specli("run", "--target", str(fixture_models.target), PROMPT, "--stop", b"\xff", cwd=tmp_path)
    assert_one_line_error(proc, 2, "--stop is not valid UTF-8")
    proc = specli("chat", "--target", str(fixture_models.target), "--no-history", "-n", "2", "-t", "1",
                  cwd=tmp_path, input=b"caf\xe9\nOnce upon a time\n")
    assert proc.returncode == 1  # a piped chat with a failed turn
    assert "the message is not valid UTF-8" in proc.stderr and "surrogates" not in proc.stderr


def test_config_files_that_are_not_files(fixture_models, tmp_path) -> None:
    os.mkfifo(tmp_path / "fifo.toml")
    proc = specli("models", "--config", str(tmp_path / "fifo.toml"), cwd=tmp_path)
    assert_one_line_error(proc, 1, "named pipe")
    os.mkfifo(tmp_path / "model.gguf")
    config = write_config(tmp_path / "c", f'[models.m]\npath = "{tmp_path / "model.gguf"}"\n')
    proc = specli("run", "--target", "m", PROMPT, "--config", str(config), cwd=tmp_path)
    assert_one_line_error(proc, 1, "named pipe")
    assert "not found" not in proc.stderr


def test_models_toml_cannot_shadow_ngram(fixture_models, tmp_path) -> None:
    config = write_config(tmp_path, f'[models.ngram]\npath = "{fixture_models.draft}"\n')
    proc = specli("run", "--target", str(fixture_models.target), "--draft", "ngram", PROMPT,
                  "--config", str(config), cwd=tmp_path)
    assert_one_line_error(proc, 1, "'ngram' is reserved")


def test_json_tokens_match_the_text_after_a_stop_string(fixture_models, tmp_path) -> None:
    """--stop cuts the text inside a token; the tokens list must not carry a token that shows nothing."""
    base = specli("run", "--target", str(fixture_models.target), PROMPT, "-n", "24", "--temp", "0", "-t", "1",
                  "--ignore-eos", "--json", cwd=tmp_path)
    tokens = json.loads(base.stdout)["tokens"]
    with load(fixture_models.target, None, n_ctx=256, n_threads=1) as spec:
        pieces = [spec.target.token_bytes(t).decode("utf-8", "replace") for t in tokens]
        detok = spec.target.detokenize
        checked = 0
        for i in range(3, len(pieces)):
            stop = pieces[i].strip()[:1]
            if not stop or stop in "".join(pieces[:i]) or not pieces[i].startswith(stop):
                continue  # want a stop string that starts exactly at token i
            proc = specli("run", "--target", str(fixture_models.target), PROMPT, "-n", "24", "--temp", "0",
                          "-t", "1", "--ignore-eos", "--stop", stop, "--json", cwd=tmp_path)
            out = json.loads(proc.stdout)
            assert out["stats"]["stop_reason"] == "stop"
            assert out["tokens"] == tokens[:i] and detok(out["tokens"]) == out["text"]
            checked += 1
            if checked == 2:
                break
    assert checked, "no token in the greedy output to stop at"


# -- interruption and closed pipes -------------------------------------------------------------------


@pytest.mark.parametrize(
    "drafting",
    [["-k", "3"], ["-k", "auto"], ["--no-draft"], ["--draft-ngram"]],
    ids=["k3", "auto", "plain", "ngram"],
)
def test_ctrl_c_prints_stats_and_exits_130(fixture_models, tmp_path, drafting) -> None:
    """SIGINT once text has streamed (a marker the program wrote, not a sleep): the stats of the
    partial generation are printed and the exit code is 130, however slow the start was."""
    draft = [] if drafting == ["--no-draft"] else ["--draft", str(fixture_models.draft)]
    if drafting == ["--draft-ngram"]:
        draft, drafting = ["--draft", "ngram"], []
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text((PROMPT + " ") * 300)  # a long prompt: the first output comes after its evaluation
    with prompt_file.open() as stdin:
        proc = start_specli("--target", str(fixture_models.target), *draft, *drafting, "-", "-n", "200000",
                            cwd=tmp_path, stdin=stdin)
        first = proc.stdout.read(1)  # blocks until generated text streams: the marker
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, err
    assert len(first) == 1 and b"Traceback" not in err
    assert b"stop_reason: interrupted" in err
    generated = int(err.split(b"generated_tokens:")[1].split()[0])
    assert generated >= 1


class _InterruptAt:
    """Wraps a llama.cpp function: raises KeyboardInterrupt at its n-th call, just before or just after
    the C call itself, which is where a real SIGINT surfaces (Python runs signal handlers only between
    bytecodes, so around a C call, never inside it). Counting calls makes the points deterministic."""

    def __init__(self, real, n: int, after: bool) -> None:
        self.real, self.n, self.after, self.calls, self.fired = real, n, after, 0, False

    def __call__(self, *args):
        self.calls += 1
        if self.calls == self.n and not self.after:
            self.fired = True
            raise KeyboardInterrupt
        result = self.real(*args)
        if self.calls == self.n and self.after:
            self.fired = True
            raise KeyboardInterrupt
        return result


@pytest.mark.parametrize("function", ["llama_decode", "llama_memory_seq_rm"])
def test_interrupts_anywhere_leave_the_caches_consistent(fixture_models, monkeypatch, function) -> None:
    """KeyboardInterrupt before and after many counted llama.cpp calls (prompt evaluation, drafting,
    verification, cache truncation): the cache records stay true, and the next generation is still
    exactly the greedy one."""
    greedy = GenerationParams(max_tokens=40, sampling=SamplingParams(temperature=0.0), draft_max=3)
    long_prompt = (PROMPT + " ") * 60
    params = GenerationParams(max_tokens=120, sampling=SamplingParams(temperature=1.0), draft_max=3,
                              ignore_eos=True, seed=7)
    with load(fixture_models.target, None, n_ctx=2048, n_threads=1) as plain:
        expected = [e.token for e in plain.generate(PROMPT, greedy) if isinstance(e, TokenEvent)]
    real = getattr(llama_cpp, function)
    with load(fixture_models.target, fixture_models.draft, n_ctx=2048, n_threads=1) as spec:
        counter = _InterruptAt(real, n=0, after=False)  # counts the calls of one whole generation
        monkeypatch.setattr(specli_llama.llc, function, counter)
        spec.engine.reset()
        for _ in spec.generate(long_prompt, params):
            pass
        total = counter.calls
        assert total >= 10, total
        points = sorted({1, 2, 3, *np.linspace(4, total, 8).astype(int).tolist()})
        for n in points:
            for after in (False, True):
                spec.engine.reset()  # the same generation each time, so call n is the same operation
                hook = _InterruptAt(real, n, after)
                monkeypatch.setattr(specli_llama.llc, function, hook)
                with pytest.raises(KeyboardInterrupt):
                    for _ in spec.generate(long_prompt, params):
                        pass
                assert hook.fired
                monkeypatch.setattr(specli_llama.llc, function, real)
                for model in (spec.target, spec.drafter.model):
                    assert llama_cpp.llama_memory_seq_pos_max(model._mem, 0) + 1 == model.n_past, (n, after)
                got = [e.token for e in spec.generate(PROMPT, greedy) if isinstance(e, TokenEvent)]
                assert got == expected, (n, after)


def test_ctrl_c_keeps_what_was_streamed(fixture_models, tmp_path) -> None:
    proc = start_specli(
        "--target",
        str(fixture_models.target),
        "--draft",
        str(fixture_models.draft),
        PROMPT,
        "-n",
        "200000",
        cwd=tmp_path,
    )
    first = proc.stdout.read(20)  # text has streamed
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130
    assert len(first) == 20 and b"generated_tokens:" in err
    generated = int(err.split(b"generated_tokens:")[1].split()[0])
    assert generated > 0


def test_closed_stdout_ends_quietly(fixture_models, tmp_path) -> None:
    proc = start_specli("--target", str(fixture_models.target), PROMPT, "-n", "5000", cwd=tmp_path)
    proc.stdout.read(5)
    proc.stdout.close()  # like `specli run ... | head -c 5`
    err = proc.stderr.read()
    assert proc.wait(timeout=TIMEOUT) == 0
    assert b"Traceback" not in err and b"error" not in err


# -- resources -------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    """Resident memory after handing freed heap pages back (glibc malloc_trim): what is left is what
    is still allocated, not what the allocator happens to keep cached."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc (Linux)")
def test_memory_is_flat_across_generations(fixture_models) -> None:
    """Growth between the lower envelopes of two groups of generations, after warm-up and with freed
    heap pages returned (measured: flat within 0.1 MiB), so allocator noise does not count while a
    leak proportional to the work does: keeping one float32 logits row per generated token would add
    600 x 600 x 4 B = 1.4 MiB per generation, at least 2.9 MiB between the groups."""
    params = GenerationParams(
        max_tokens=600, sampling=SamplingParams(temperature=1.0), seed=1, draft_max=3, ignore_eos=True
    )
    samples = []
    with load(fixture_models.target, fixture_models.draft, n_ctx=2048, n_threads=1) as spec:
        for seed in range(6):
            generation = spec.generate(PROMPT, replace(params, seed=seed)).complete()
            assert generation.stats.n_generated == 600
            samples.append(_rss_bytes())
    grown = min(samples[4:6]) - min(samples[1:3])
    kib = [s >> 10 for s in samples]
    assert grown < 2 * 2**20, f"resident memory grew by {grown / 2**20:.2f} MiB: {kib} KiB"
