"""The chat loop on real inference: cache reuse across turns, greedy equivalence, commands, context fitting,
templates (fallback ChatML, Qwen2 ChatML, Llama 3 headers) and the piped front end."""

from __future__ import annotations

import io
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from specli import GenerationParams, SamplingParams, load
from specli.chat.repl import read_message, run_chat
from specli.chat.session import TRIM_TO, ChatError, ChatOptions, ChatSession, ContextNotice, format_turn_line
from specli.chat_template import ChatTemplate
from specli.cli import app
from specli.events import DoneEvent, PromptEvent, TokenEvent
from specli.settings import RunSettings, defaults_for
from specli_synth.fixtures import FIXTURE_N_VOCAB, fixture_documents
from specli_synth.gguf_writer import LlamaSpec, write_llama_gguf
from specli_synth.vocab import TOKEN_TYPE_CONTROL, Vocab, train_vocab


def chat_settings(**values) -> RunSettings:
    return defaults_for("chat").merged(values)


GREEDY = ChatOptions(settings=chat_settings(temp=0.0, max_tokens=24, draft_max=3), history=False)

# Chat templates written out in the shape Qwen2 and Llama 3 ship them.
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def chat(spec, lines: str, options: ChatOptions = GREEDY) -> tuple[int, str, str]:
    """run_chat over piped input; (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = run_chat(spec, options, input_stream=io.StringIO(lines),
                    console=Console(file=out, highlight=False, width=200),
                    err_console=Console(file=err, highlight=False, width=200))
    return code, out.getvalue(), err.getvalue()


def run_turn(session: ChatSession, text: str) -> list:
    return list(session.send(text))


# -- template-carrying fixture models ------------------------------------------------------------------


def _write_chat_model(path: Path, template: str, specials: list[str], bos: str, eos: str) -> Path:
    """A tiny random-weight llama model: the fixture vocabulary plus control tokens for the template."""
    base = train_vocab(fixture_documents(), FIXTURE_N_VOCAB).vocab
    tokens = base.tokens + tuple(specials)
    vocab = Vocab(tokens, base.scores + (0.0,) * len(specials),
                  base.token_types + (TOKEN_TYPE_CONTROL,) * len(specials),
                  unk_id=base.unk_id, bos_id=tokens.index(bos), eos_id=tokens.index(eos))
    spec = LlamaSpec(n_vocab=len(tokens), n_embd=32, n_layer=1, n_head=2, n_head_kv=2, n_ff=64,
                     name=path.stem)
    rng = np.random.default_rng(0)
    weights = {name: np.ones(shape, np.float32) if len(shape) == 1
               else rng.normal(0.0, 0.5, shape).astype(np.float32)
               for name, shape in spec.tensor_shapes().items()}
    return write_llama_gguf(path, spec, vocab, weights, dtype="f32", chat_template=template)


@pytest.fixture(scope="module")
def qwen2_model(tmp_path_factory) -> Path:
    return _write_chat_model(tmp_path_factory.mktemp("qwen2") / "qwen2-chat.gguf", QWEN2_TEMPLATE,
                             ["<|im_start|>", "<|im_end|>", "<|endoftext|>"], bos="<s>", eos="<|im_end|>")


@pytest.fixture(scope="module")
def llama3_model(tmp_path_factory) -> Path:
    return _write_chat_model(
        tmp_path_factory.mktemp("llama3") / "llama3-chat.gguf", LLAMA3_TEMPLATE,
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        bos="<|begin_of_text|>", eos="<|eot_id|>")


# -- two turns: cache reuse and greedy equivalence -------------------------------------------------------


def test_piped_two_turns_reuse_the_cache_and_match_plain_generation(fixture_models, tmp_path) -> None:
    save = tmp_path / "transcript.json"
    with load(fixture_models.target, fixture_models.draft, n_ctx=512) as spec:
        code, out, err = chat(spec, f"Once upon a time\nThe bird was sad\n/save {save}\n")
    assert code == 0
    data = json.loads(save.read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user", "assistant"]
    replies = [m["content"] for m in data["messages"] if m["role"] == "assistant"]
    assert all(replies)
    assert out == "".join(r + "\n" for r in replies)  # stdout: the replies only

    t1, t2 = data["turns"]
    assert t1["prefill_tokens"] == t1["prompt_tokens"]
    # Turn 2 evaluates only what turn 1 left out of the cache: the template's glue and the new message.
    new_tokens = t2["prompt_tokens"] - t1["prompt_tokens"] - t1["generated_tokens"]
    assert t2["prefill_tokens"] <= new_tokens + 2
    assert t2["prefill_tokens"] < t2["prompt_tokens"] // 2
    prefills = [int(n) for n in re.findall(r"prefill (\d+)", err)]
    assert prefills == [t1["prefill_tokens"], t2["prefill_tokens"]]
    assert "no chat template" in err and "ChatML" in err  # the fixture target has no template

    # Each reply is what plain greedy decoding of that rendered prompt gives, without any cache.
    template = ChatTemplate.from_strings(None, "<s>", "</s>")
    for i, reply in enumerate(replies):
        history = data["messages"][: 2 * i + 1]
        with load(fixture_models.target, None, n_ctx=512) as plain:
            text = template.render(history, add_generation_prompt=True)
            tokens = plain.target.tokenize(text, add_special=True, parse_special=True)
            assert len(tokens) == data["turns"][i]["prompt_tokens"]
            params = GenerationParams(max_tokens=GREEDY.settings.max_tokens,
                                      sampling=SamplingParams(temperature=0.0),
                                      stop=data["settings"]["stop"])
            done = [e for e in plain.generate(tokens, params) if isinstance(e, DoneEvent)][0]
        assert done.text == reply


def test_session_turns_and_the_stats_line(fixture_models) -> None:
    with load(fixture_models.target, fixture_models.draft, n_ctx=512) as spec:
        session = ChatSession(spec, GREEDY)
        events = run_turn(session, "Once upon a time")
        prompt = next(e for e in events if isinstance(e, PromptEvent))
        assert prompt.n_evaluated == prompt.n_prompt == len(session.last_prompt.tokens)
        first_prompt = len(session.last_prompt.tokens)
        events = run_turn(session, "Tell me about the fox")
        prompt = next(e for e in events if isinstance(e, PromptEvent))
        assert prompt.n_evaluated < prompt.n_prompt - first_prompt
        turn = session.turns[-1]
        assert turn.prefill_tokens == prompt.n_evaluated
        line = format_turn_line(turn)
        assert line.startswith(f"{turn.generated_tokens} token") and "tok/s" in line
        assert f"prefill {prompt.n_evaluated}" in line
        assert turn.drafted > 0 and "acceptance" in line
        totals = session.totals()
        assert totals.turns == 2 and totals.generated_tokens == sum(t.generated_tokens for t in session.turns)


def test_an_interrupted_reply_is_kept_and_the_next_turn_reuses_the_cache(fixture_models) -> None:
    with load(fixture_models.target, fixture_models.draft, n_ctx=512) as spec:
        session = ChatSession(spec, GREEDY)
        stream = session.send("Once upon a time")
        shown = []
        for event in stream:
            if isinstance(event, TokenEvent) and event.text:
                shown.append(event.text)
                if len(shown) == 3:
                    break
        stream.close()  # what the UI does on Ctrl-C
        first_prompt = len(session.last_prompt.tokens)
        assert session.messages[-1] == {"role": "assistant", "content": "".join(shown)}
        assert session.turns[-1].stop_reason == "interrupted"
        assert "interrupted" in format_turn_line(session.turns[-1])
        run_turn(session, "The bird was sad")
        second = session.turns[-1]
        assert second.stop_reason != "interrupted"
        # The cache still holds the first prompt and the shown part of the reply: not evaluated again.
        assert second.prefill_tokens <= second.prompt_tokens - first_prompt - len(shown) + 1
        assert [m["role"] for m in session.messages] == ["user", "assistant"] * 2


class _InterruptingFile(io.StringIO):
    """Stdout that sends this process SIGINT (`times` of them at once) at its n-th write, like Ctrl-C."""

    def __init__(self, at_write: int, times: int = 1) -> None:
        super().__init__()
        self.at_write, self.times, self.writes = at_write, times, 0

    def write(self, text: str) -> int:
        n = super().write(text)
        self.writes += 1
        if self.writes == self.at_write:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)
        return n


@pytest.mark.parametrize("times", [1, 2])
def test_ctrl_c_during_a_piped_reply_stops_it_and_the_chat_with_130(fixture_models, tmp_path, times) -> None:
    """Piped, Ctrl-C means stop: the partial reply is shown and kept, the next line is not read, and the
    exit code says so (it used to go on to the next line and exit 0, so a script could not tell).
    In a terminal the chat goes on: test_ctrl_c_in_a_terminal_stops_the_reply_and_the_chat_goes_on."""
    out, err = _InterruptingFile(at_write=3, times=times), io.StringIO()
    options = ChatOptions(settings=chat_settings(temp=0.0, max_tokens=200, draft_max=2), history=False)
    previous = signal.getsignal(signal.SIGINT)
    with load(fixture_models.target, fixture_models.draft, n_ctx=512) as spec:
        lines = io.StringIO("Once upon a time\nThe bird was sad\n")
        code = run_chat(spec, options, input_stream=lines, console=Console(file=out, highlight=False),
                        err_console=Console(file=err, highlight=False))
    assert signal.getsignal(signal.SIGINT) is previous  # the reply's handler is removed again
    assert code == 130
    assert lines.readline() == "The bird was sad\n"  # not read: the chat stopped
    shown = out.getvalue()
    assert shown.endswith("\n") and shown.count("\n") == 1 and len(shown) > 1  # one partial reply
    said = err.getvalue().splitlines()
    assert said[1] == "[1] > Once upon a time"  # which line the reply answers
    assert said[2].startswith("[1] ") and "interrupted" in said[2]


def test_an_interrupt_inside_the_engine_keeps_the_caches_consistent(fixture_models) -> None:
    """Ctrl-C inside the engine ends the turn as interrupted; the caches are not thrown away (each
    Model knows what its cache holds), so the next turn reuses them and still replies as plain does."""
    with load(fixture_models.target, fixture_models.draft, n_ctx=512) as spec:
        session = ChatSession(spec, GREEDY)
        decode, calls = spec.target.decode, []

        def interrupted_decode(*args, **kw):
            calls.append(1)
            if len(calls) == 4:
                raise KeyboardInterrupt
            return decode(*args, **kw)

        spec.target.decode = interrupted_decode
        with pytest.raises(KeyboardInterrupt):
            run_turn(session, "Once upon a time")
        spec.target.decode = decode
        turn = session.turns[-1]
        assert turn.stop_reason == "interrupted"
        assert spec.target.n_past > 0
        assert [m["role"] for m in session.messages] == ["user", "assistant"]
        events = run_turn(session, "The bird was sad")
        assert session.turns[-1].prefill_tokens < session.turns[-1].prompt_tokens  # the cache was reused
        reply = events[-1].text
        with load(fixture_models.target, None, n_ctx=512) as plain:
            params = GenerationParams(max_tokens=GREEDY.settings.max_tokens,
                                      sampling=SamplingParams(temperature=0.0),
                                      stop=session.stops)
            done = list(plain.generate(session.last_prompt.tokens, params))[-1]
        assert done.text == reply


# -- commands ------------------------------------------------------------------------------------------


def test_slash_commands_in_a_piped_session(fixture_models, tmp_path) -> None:
    save = tmp_path / "out.json"
    script = "\n".join([
        "/help", "/k 2", "/temp 0", "/k 99", "/k two", "/temp -1", "/temp warm", "/frobnicate", "/save",
        "Once upon a time", "/stats", "/reset", "/system Tell short stories.", "The bird was sad",
        f"/save {save}", "/exit", "this line is never read",
    ]) + "\n"
    options = ChatOptions(settings=chat_settings(temp=0.8, max_tokens=16), history=False)
    with load(fixture_models.target, fixture_models.draft, n_ctx=512) as spec:
        code, out, err = chat(spec, script, options)
    assert code == 0
    assert "/k N|auto" in err  # /help
    assert "k = 2" in err and "temperature = 0 (greedy)" in err
    assert '/k must be a whole number from 0 to 64, or "auto", got 99' in err
    assert "/k takes a whole number" in err and "'two'" in err
    assert "/temp must be a finite number >= 0" in err
    assert "/temp takes a finite number >= 0 (0 is greedy), not 'warm'" in err
    assert "unknown command /frobnicate: /help lists the commands" in err
    assert "usage: /save FILE" in err
    assert "1 turn · " in err  # /stats after the first turn
    assert "conversation cleared" in err
    data = json.loads(save.read_text())
    # /reset dropped the first exchange; /system added a system message.
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant"]
    assert data["messages"][0]["content"] == "Tell short stories."
    assert data["messages"][1]["content"] == "The bird was sad"
    assert data["settings"]["draft_max"] == 2 and data["settings"]["temperature"] == 0
    assert len(data["turns"]) == 2
    for turn in data["turns"]:
        assert turn["draft_max"] == 2 and turn["temperature"] == 0
        assert max(turn["stats"]["k_per_round"]) <= 2
    assert out.count("\n") >= 2 and "never read" not in out + err


def test_commands_change_the_next_turns_params(fixture_models, tmp_path) -> None:
    with load(fixture_models.target, fixture_models.draft, n_ctx=512) as spec:
        session = ChatSession(spec, ChatOptions(system="Be kind.", history=False))
        assert session.command("/k auto").text == "k = auto"
        assert session.command("/k 3").text == "k = 3"
        assert session.generation_params().draft_max == 3
        assert not session.command("/temp 0.25").error
        assert session.generation_params().sampling.temperature == 0.25
        assert session.command("/temp nan").error
        assert session.command("/system").text == "system: 'Be kind.'"
        session.command("/system Be brief.")
        assert session.messages == [{"role": "system", "content": "Be brief."}]
        result = session.command(f"/save {tmp_path / 'missing-dir' / 'x.json'}")
        assert result.error and "cannot write" in result.text and "\n" not in result.text
        assert session.command("/exit").exit and session.command("/quit").exit


def test_input_lines_blocks_and_continuations() -> None:
    def reader(text: str):
        lines = iter(text.split("\n"))
        return lambda _prompt: next(lines, None)

    read = reader('plain\nfirst \\\nsecond\n'
                  '"""\nblock one\n\n  block two\n"""\n"""inline"""\n"""tail\nend"""\n')
    assert read_message(read) == "plain"
    assert read_message(read) == "first \nsecond"
    assert read_message(read) == "block one\n\n  block two"
    assert read_message(read) == "inline"
    assert read_message(read) == "tail\nend"
    assert read_message(read) == ""  # the empty last line
    assert read_message(read) is None
    assert read_message(reader('"""\nunterminated')) == "unterminated"  # EOF closes a block


def test_piped_multiline_block_is_one_turn_and_double_slash_escapes(fixture_models, tmp_path) -> None:
    save = tmp_path / "t.json"
    with load(fixture_models.target, fixture_models.draft, n_ctx=512) as spec:
        code, _, err = chat(spec, f'"""\nOnce upon a time\nthere was a fox\n"""\n//etc\n/save {save}\n')
    assert code == 0 and "unknown command" not in err
    users = [m["content"] for m in json.loads(save.read_text())["messages"] if m["role"] == "user"]
    assert users == ["Once upon a time\nthere was a fox", "/etc"]


# -- the context --------------------------------------------------------------------------------------


def test_oldest_turns_are_dropped_to_fit_the_context(fixture_models) -> None:
    options = ChatOptions(system="Stories.", settings=chat_settings(temp=0.0, max_tokens=16, draft_max=2),
                          history=False)
    with load(fixture_models.target, fixture_models.draft, n_ctx=256) as spec:
        n_ctx = spec.target.n_ctx
        session = ChatSession(spec, options)
        assert session.reply_reserve() == 16
        notices = []
        reused_after_drop = False
        for i in range(8):
            events = run_turn(session, f"Tell me story number {i} about the fox and the bird")
            notices += [e for e in events if isinstance(e, ContextNotice)]
            prepared, turn = session.last_prompt, session.turns[-1]
            assert len(prepared.tokens) + session.reply_reserve() <= n_ctx
            assert session.messages[0] == {"role": "system", "content": "Stories."}
            assert turn.dropped_turns == prepared.dropped_turns
            if prepared.dropped_turns:
                # Trimmed with slack, so that the next turns fit without dropping again.
                assert len(prepared.tokens) + session.reply_reserve() <= n_ctx * TRIM_TO
            elif i and session.turns[-2].dropped_turns:
                previous = session.turns[-2]
                new_tokens = turn.prompt_tokens - previous.prompt_tokens - previous.generated_tokens
                assert turn.prefill_tokens <= new_tokens + 2  # the cache is reused again after a drop
                reused_after_drop = True
        assert notices, "8 turns should overflow a 256-token context"
        assert reused_after_drop
        assert "old turn" in notices[0].message and "to fit the context" in notices[0].message
        roles = [m["role"] for m in session.messages]
        assert roles[0] == "system" and roles[1:] == ["user", "assistant"] * ((len(roles) - 1) // 2)
        assert len(roles) < 1 + 2 * 8

        with pytest.raises(ChatError, match="does not fit"):
            session.send("fox " * 400)
        assert session.messages[-1]["role"] == "assistant"  # the refused message was not added


def test_piped_chat_reports_dropped_turns(fixture_models) -> None:
    options = ChatOptions(settings=chat_settings(temp=0.0, max_tokens=16), history=False)
    lines = "".join(f"Tell me story number {i} about the fox and the bird\n" for i in range(8))
    with load(fixture_models.target, fixture_models.draft, n_ctx=256) as spec:
        code, out, err = chat(spec, lines, options)
    assert code == 0
    assert re.search(r"dropped \d+ old turns? to fit the context", err)
    assert err.count("prefill") == 8


# -- templates ----------------------------------------------------------------------------------------


def test_model_without_template_falls_back_to_chatml_with_a_notice(fixture_models) -> None:
    with load(fixture_models.target, None, n_ctx=256) as spec:
        session = ChatSession(spec, GREEDY)
        assert session.template.is_fallback
        assert "no chat template" in session.template_notice and "ChatML" in session.template_notice
        prepared = session.prepare("Hello")
        assert prepared.text == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
        assert prepared.tokens[0] == spec.target.vocab_info().bos  # BOS added by the tokenizer
        assert session.stops == ["<|im_end|>", "</s>"]


def test_qwen2_chatml_template_from_the_gguf(qwen2_model) -> None:
    with load(qwen2_model, "ngram", n_ctx=512) as spec:
        options = ChatOptions(settings=chat_settings(temp=0.0, max_tokens=12), history=False)
        session = ChatSession(spec, options)
        assert not session.template.is_fallback and session.template_notice is None
        assert "<|im_end|>" in session.stops
        prepared = session.prepare("Hello")
        assert prepared.text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
        im_start = spec.target.tokenize("<|im_start|>", add_special=False, parse_special=True)
        assert len(im_start) == 1  # a control token, parsed as one
        assert prepared.tokens.count(im_start[0]) == 3  # system, user, assistant
        run_turn(session, "Hello")
        first = session.turns[-1]
        run_turn(session, "And then?")
        second = session.turns[-1]
        assert second.prefill_tokens < second.prompt_tokens - first.prompt_tokens + 2
        options = ChatOptions(settings=chat_settings(temp=0.0, max_tokens=8), history=False)
        code, out, err = chat(spec, "Hello\n", options)
        assert code == 0 and "note:" not in err


def test_llama3_template_renders_header_tokens_and_one_bos(llama3_model) -> None:
    with load(llama3_model, None, n_ctx=512) as spec:
        options = ChatOptions(system="  Be brief.  ", settings=chat_settings(temp=0.0, max_tokens=8),
                              history=False)
        session = ChatSession(spec, options)
        assert not session.template.is_fallback
        assert session.template.bos_token == "<|begin_of_text|>"
        assert session.stops == ["<|eot_id|>"]
        prepared = session.prepare("Hi there")
        assert prepared.text == (
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
        )
        vocab = spec.target.vocab_info()
        header = spec.target.tokenize("<|start_header_id|>", add_special=False, parse_special=True)
        assert len(header) == 1
        assert prepared.tokens[0] == vocab.bos and prepared.tokens.count(vocab.bos) == 1  # not doubled
        assert prepared.tokens.count(header[0]) == 3
        events = run_turn(session, "Hi there")
        assert isinstance(events[-1], DoneEvent)
        assert session.messages[-1]["role"] == "assistant"


def test_slash_stats_and_bye_report_the_session_totals(fixture_models, tmp_path) -> None:
    save = tmp_path / "t.json"
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        code, _, err = chat(spec, f"Once upon a time\nThe bird was sad\n/stats\n/save {save}\n/bye\nnever\n")
    assert code == 0
    turns = json.loads(save.read_text())["turns"]
    generated = sum(t["generated_tokens"] for t in turns)
    drafted, accepted = sum(t["drafted"] for t in turns), sum(t["accepted"] for t in turns)
    prefill = sum(t["prefill_tokens"] for t in turns)
    line = next(line for line in err.splitlines() if line.startswith("2 turns · "))
    assert f"· {generated} tokens ·" in line and f"({accepted}/{drafted})" in line
    assert line.endswith(f"prefill {prefill}")


# -- the `specli chat` command ---------------------------------------------------------------------------

runner = CliRunner()


def chat_cli(fixture_models, lines: str, *extra: str):
    args = ["chat", "--target", str(fixture_models.target), "--draft", str(fixture_models.draft),
            "-t", "1", "-c", "256", "--no-history", *extra]
    return runner.invoke(app, args, input=lines, catch_exceptions=False)


def test_chat_command_options_reach_the_conversation(fixture_models, tmp_path) -> None:
    save = tmp_path / "t.json"
    result = chat_cli(fixture_models, f"Once upon a time\n/save {save}\n", "--system", "Be terse.",
                      "-n", "6", "--temp", "0", "-k", "2", "--seed", "5")
    assert result.exit_code == 0, result.output
    data = json.loads(save.read_text())
    assert data["messages"][0] == {"role": "system", "content": "Be terse."}
    settings = data["settings"]
    assert (settings["max_tokens"], settings["temperature"], settings["draft_max"]) == (6, 0, 2)
    turn = data["turns"][0]
    assert turn["generated_tokens"] <= 6 and max(turn["stats"]["k_per_round"]) <= 2
    assert result.stdout == data["messages"][-1]["content"] + "\n"  # stdout: the reply only
    assert "prefill" in result.stderr


def test_chat_command_settings_from_models_toml(fixture_models, tmp_path) -> None:
    save = tmp_path / "t.json"
    Path("models.toml").write_text(  # the test's own empty working directory
        "[defaults]\nthreads = 1\nctx = 256\n"
        f'[models.tiny]\npath = "{fixture_models.target}"\ndraft = "tinydraft"\n'
        "temp = 0.0\ndraft_max = 1\nmax_tokens = 5\n"
        f'[models.tinydraft]\npath = "{fixture_models.draft}"\n'
    )
    result = runner.invoke(app, ["chat", "tiny", "--no-history"], input=f"Hello\n/save {save}\n",
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(save.read_text())
    assert (data["settings"]["max_tokens"], data["settings"]["temperature"]) == (5, 0)
    assert data["settings"]["draft_max"] == 1
    assert data["turns"][0]["drafted"] > 0  # the draft named in the file was loaded and used


def test_piped_chat_goes_on_after_a_failed_turn_and_exits_1(fixture_models, tmp_path) -> None:
    save = tmp_path / "t.json"
    result = chat_cli(fixture_models, "fox " * 400 + f"\nOnce upon a time\n/save {save}\n",
                      "-n", "6", "--temp", "0")
    assert result.exit_code == 1
    assert "does not fit" in result.stderr
    data = json.loads(save.read_text())
    assert [m["content"] for m in data["messages"] if m["role"] == "user"] == ["Once upon a time"]
    assert len(data["turns"]) == 1 and "Traceback" not in result.output


def test_chat_command_usage_errors(fixture_models) -> None:
    both = runner.invoke(app, ["chat", "x", "--target", str(fixture_models.target)])
    neither = runner.invoke(app, ["chat"])
    bad_k = runner.invoke(app, ["chat", "--target", str(fixture_models.target), "-k", "many"])
    for result in (both, neither, bad_k):
        assert result.exit_code == 2 and result.stderr.startswith("specli: error: ")
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_template_that_fails_to_render_falls_back_to_chatml(tmp_path) -> None:
    broken = "{{ raise_exception('this template is broken') }}"
    model = _write_chat_model(tmp_path / "broken.gguf", broken, ["<|im_start|>", "<|im_end|>"],
                              bos="<s>", eos="</s>")
    with load(model, None, n_ctx=256, n_threads=1) as spec:
        session = ChatSession(spec, GREEDY)
        assert session.template.is_fallback
        assert "chat template does not work" in session.template_notice
        assert "this template is broken" in session.template_notice
        assert session.prepare("Hi").text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        options = ChatOptions(settings=chat_settings(temp=0.0, max_tokens=4), history=False)
        code, _, err = chat(spec, "Hi\n", options)
    assert code == 0
    assert "note: broken.gguf's chat template does not work" in err


def test_a_template_that_would_not_end_falls_back_at_load(tmp_path) -> None:
    """A model whose chat template loops for hours hung `specli chat` at load; one whose error text
    carries escape codes wrote them to the terminal. Both fall back to ChatML with a printable note."""
    looping = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    escaping = "{{ raise_exception('\x1b[2J\x1b]0;pwned\x07') }}"
    for name, template in (("looping", looping), ("escaping", escaping)):
        model = _write_chat_model(tmp_path / f"{name}.gguf", template, ["<|im_start|>", "<|im_end|>"],
                                  bos="<s>", eos="</s>")
        with load(model, None, n_ctx=256, n_threads=1) as spec:
            options = ChatOptions(settings=chat_settings(temp=0.0, max_tokens=4), history=False)
            code, out, err = chat(spec, "Hi\n", options)
        assert code == 0 and out.count("\n") == 1
        assert f"note: {name}.gguf's chat template does not work" in err and "\x1b" not in err


def test_a_system_message_that_cannot_fit_is_refused(fixture_models, tmp_path) -> None:
    """A --system message longer than the context was accepted, then every turn failed with advice
    (/reset) that could not work: /reset keeps the system message. Refused up front (exit 2), and
    /system refuses one too, keeping the one it had."""
    long_text = "Once upon a time there was a fox " * 100
    runner = CliRunner()
    result = runner.invoke(app, ["chat", "--target", str(fixture_models.target), "--no-history", "-c", "256",
                                 "-t", "1", "--system", long_text], input="Hi\n")
    assert result.exit_code == 2
    assert "--system is" in result.stderr and "raise --ctx" in result.stderr and result.stdout == ""
    with load(fixture_models.target, None, n_ctx=256, n_threads=1) as spec:
        session = ChatSession(spec, ChatOptions(system="Be brief.", settings=chat_settings(max_tokens=8)))
        answer = session.command(f"/system {long_text}")
        assert answer.error and "the system message is" in answer.text
        assert session.system == "Be brief."
        run_turn(session, "Once upon a time")
        assert session.turns[-1].generated_tokens > 0


def _interactive_chat(fixture_models, tmp_path, *extra: str) -> str:
    """`specli chat` on a pseudo-terminal: type a message, wait until its reply's stats line is shown,
    then /exit. Returns what the terminal showed."""
    pty = pytest.importorskip("pty", reason="needs a POSIX pseudo-terminal")
    exe = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "TERM": "xterm"}
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [exe, "chat", "--target", str(fixture_models.target), "--draft", str(fixture_models.draft), "-t", "1",
         "-c", "256", "-n", "6", "--temp", "0", *extra],
        stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, env=env, close_fds=True)
    os.close(slave)
    seen = b""

    def wait_for(pattern: bytes) -> None:
        nonlocal seen
        deadline = time.monotonic() + 120  # a hang guard only: the wait is for the output
        while not re.search(pattern, seen):
            assert time.monotonic() < deadline, f"waited for {pattern!r}: {seen[-400:]!r}"
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    raise AssertionError(f"the chat ended early: {seen[-400:]!r}") from None

    try:
        wait_for(rb"/help for commands")
        os.write(master, b"Once upon a time\n")
        wait_for(rb"prefill \d+")
        os.write(master, b"/exit\n")
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return seen.decode("utf-8", errors="replace")


def test_interactive_chat_keeps_input_history_unless_told_not_to(fixture_models, tmp_path) -> None:
    history = tmp_path / "state" / "specli" / "chat_history"
    shown = _interactive_chat(fixture_models, tmp_path, "--no-history")
    assert "chatting with" in shown and not history.exists()
    shown = _interactive_chat(fixture_models, tmp_path)
    assert "accepted draft" in shown  # the legend: the terminal view, not the piped one
    lines = history.read_text().splitlines()
    assert "Once upon a time" in lines and "/exit" in lines


def test_ctrl_c_in_a_terminal_stops_the_reply_and_the_chat_goes_on(fixture_models, tmp_path) -> None:
    """In a terminal, Ctrl-C during a reply stops that reply (its stats line says so), the prompt comes
    back for the next message, and the chat ends normally with /exit."""
    pty = pytest.importorskip("pty", reason="needs a POSIX pseudo-terminal")
    exe = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "TERM": "xterm"}
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [exe, "chat", "--target", str(fixture_models.target), "-t", "1", "-c", "16384", "-n", "100000",
         "--temp", "0", "--no-history"],
        stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, env=env, close_fds=True)
    os.close(slave)
    seen = b""

    def wait_for(pattern: bytes, start: int = 0) -> None:
        nonlocal seen
        deadline = time.monotonic() + 120  # a hang guard only: the wait is for the output
        while not re.search(pattern, seen[start:]):
            assert time.monotonic() < deadline, f"waited for {pattern!r}: {seen[-400:]!r}"
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    raise AssertionError(f"the chat ended early: {seen[-400:]!r}") from None

    try:
        wait_for(rb"> ")  # the prompt: typed ahead, the line would be echoed before the note
        mark = len(seen)
        os.write(master, b"Once upon a time\n")
        wait_for(rb"Once upon a time\r?\n[^\n]{20}", mark)  # the reply streams
        proc.send_signal(signal.SIGINT)
        wait_for(rb"interrupted", mark)
        mark = len(seen)
        os.write(master, b"/k\n")  # the prompt is back
        wait_for(rb"k = ", mark)
        os.write(master, b"/exit\n")
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)

