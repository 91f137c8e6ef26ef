"""`specli serve` through real clients: the `openai` package and plain HTTP against a real server process on
127.0.0.1 (a free port), running real llama.cpp inference on the fixture models. Nothing waits on the
clock: a test waits for a line the server printed, a chunk it sent or a state /health reports, each
wait bounded; every server is stopped (killed, if it must be) when its test ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from serve_support import EXE, ServerProcess, wait_until

import specli
from specli.settings import defaults_for

PROMPT = "Once upon a time"
LONG = 8000  # tokens a long generation asks for: seconds of work, so it is surely running when a test acts


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve")


@pytest.fixture(scope="module")
def pair_server(fixture_models, server_dir):
    """The fixture target with a chat template and the fixture draft, one thread, room for long runs."""
    with ServerProcess("--target", str(fixture_models.target_with_template), "--draft",
                       str(fixture_models.draft), "-t", "1", "-c", "8192", cwd=server_dir) as server:
        yield server.ready()
        assert server.stop() == 0


@pytest.fixture(scope="module")
def plain_server(fixture_models, server_dir):
    with ServerProcess("--target", str(fixture_models.target_with_template), "--no-draft", "-t", "1",
                       "-c", "8192", cwd=server_dir) as server:
        yield server.ready()
        assert server.stop() == 0


def client_for(server: ServerProcess, key: str = "no key") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def data_lines(lines) -> list[dict]:
    """The JSON chunks of a server-sent event stream up to `data: [DONE]` (which must come)."""
    chunks = []
    for line in lines:
        if line == "data: [DONE]":
            return chunks
        if line.startswith("data: "):
            chunks.append(json.loads(line[6:]))
    raise AssertionError(f"the stream ended without data: [DONE] after {len(chunks)} chunks")


# -- the OpenAI client ----------------------------------------------------------------------------------


def test_chat_completions_streamed_and_whole(pair_server) -> None:
    client = client_for(pair_server)
    request = dict(model="whatever", messages=[{"role": "user", "content": PROMPT}], max_tokens=24, seed=11,
                   temperature=0.8, extra_body={"speculative.n_max": 3})
    whole = client.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length" and whole.usage.completion_tokens == 24
    assert whole.model == "fixture-target-chat" and whole.object == "chat.completion"
    timings = whole.model_extra["timings"]
    assert timings["predicted_n"] == 24 and timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0
    speculation = whole.model_extra["speculation"]  # a fixed k never holds back: no reason to give
    assert speculation["auto_reason"] is None and speculation["auto_holdback"] is None
    assert timings["prompt_n"] + timings["cache_n"] == whole.usage.prompt_tokens

    chunks = list(client.chat.completions.create(**request, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finished] == ["length"]
    last = chunks[-1]  # the usage chunk: no choices, the usage, the timings
    assert last.choices == [] and last.usage.completion_tokens == 24
    assert last.model_extra["timings"]["draft_n_accepted"] > 0 and "timings" not in finished[0].model_extra
    assert last.model_extra["speculation"]["auto_reason"] is None
    origins = {c.model_extra["origin"] for c in chunks if c.choices and c.choices[0].delta.content}
    assert "accepted" in origins and origins <= {"accepted", "corrected", "bonus", "plain"}


def test_text_completions_streamed_and_whole(pair_server) -> None:
    client = client_for(pair_server)
    request = dict(model="m", prompt=PROMPT, max_tokens=20, seed=5, temperature=0.8,
                   extra_body={"speculative.n_max": 3, "top_k": 20, "min_p": 0.02})
    whole = client.completions.create(**request)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(**request, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text != ""
    assert chunks[-1].choices[0].finish_reason == "length"  # without include_usage: the timings here
    assert chunks[-1].model_extra["timings"]["predicted_n"] == 20
    assert chunks[-1].model_extra["speculation"]["seed"] == 5


def test_stop_texts_and_token_prompts(fixture_models, pair_server) -> None:
    client = client_for(pair_server)
    whole = client.completions.create(model="m", prompt=PROMPT, max_tokens=40, seed=2, temperature=0)
    text = whole.choices[0].text
    cut = text.split()[3]
    stopped = client.completions.create(model="m", prompt=PROMPT, max_tokens=40, seed=2, temperature=0,
                                        stop=[cut])
    assert stopped.choices[0].finish_reason == "stop" and text.startswith(stopped.choices[0].text)
    assert cut not in stopped.choices[0].text
    with specli.load(fixture_models.target_with_template, n_ctx=64, n_threads=1) as spec:
        ids = spec.tokenize(PROMPT)
    by_ids = client.completions.create(model="m", prompt=ids, max_tokens=40, seed=2, temperature=0)
    assert by_ids.choices[0].text == text


@pytest.mark.parametrize("temperature", ["0", "0.8"])
def test_served_text_is_what_specli_run_and_chat_print(fixture_models, pair_server, plain_server, tmp_path,
                                                        temperature) -> None:
    """With a seed, the server prints what `specli run` prints for the same prompt and settings, with the
    draft and without (same-as-plain), and a chat reply is what `specli chat` replies."""
    model, draft = str(fixture_models.target_with_template), str(fixture_models.draft)
    settings = ["-n", "32", "-s", "7", "--temp", temperature, "-t", "1", "-c", "8192"]
    run = subprocess.run([EXE, "run", "--target", model, "--draft", draft, *settings, "--json", PROMPT],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    expected = json.loads(run.stdout)["text"]
    chat = subprocess.run([EXE, "chat", "--target", model, "--draft", draft, *settings], input=PROMPT + "\n",
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert chat.returncode == 0, chat.stderr
    for server in (pair_server, plain_server):
        client = client_for(server)
        served = client.completions.create(model="m", prompt=PROMPT, max_tokens=32, seed=7,
                                           temperature=float(temperature))
        assert served.choices[0].text == expected
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}],
                                               max_tokens=32, seed=7, temperature=float(temperature))
        assert reply.choices[0].message.content + "\n" == chat.stdout


def test_chat_turns_reuse_the_kv_cache(pair_server) -> None:
    client = client_for(pair_server)
    messages = [{"role": "system", "content": "Tell a story."}]
    previous = None
    for turn, text in enumerate(["Once upon a time", "The dog ran to the park.", "Then Pip sang a song."]):
        messages.append({"role": "user", "content": text})
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=12, seed=turn,
                                               temperature=0)
        timings = reply.model_extra["timings"]
        assert timings["prompt_n"] + timings["cache_n"] == reply.usage.prompt_tokens
        assert reply.usage.prompt_tokens_details.cached_tokens == timings["cache_n"]
        if previous is not None:  # the whole previous prompt came from the cache, and part of its reply
            assert timings["cache_n"] >= previous.usage.prompt_tokens
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        previous = reply


def test_cache_prompt_false_evaluates_the_whole_prompt_afresh(pair_server) -> None:
    """llama-server's `cache_prompt`: false evaluates every prompt token again (on the F32 fixtures the
    reply is the same either way: their batched and single-token logits are bit-identical)."""
    client = client_for(pair_server)
    request = dict(model="m", prompt=PROMPT, max_tokens=12, seed=3, temperature=0.8)
    warm = client.completions.create(**request)
    warm = client.completions.create(**request)
    fresh = client.completions.create(**request, extra_body={"cache_prompt": False})
    assert warm.model_extra["timings"]["cache_n"] > 0
    timings = fresh.model_extra["timings"]
    assert timings["cache_n"] == 0 and timings["prompt_n"] == fresh.usage.prompt_tokens
    assert fresh.choices[0].text == warm.choices[0].text


def test_an_ipv6_address_in_brackets_is_listened_on(fixture_models, tmp_path) -> None:
    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with ServerProcess("--target", str(fixture_models.target), "--no-draft", "-t", "1", cwd=tmp_path,
                       host="[::1]") as server:
        server.ready()
        assert server.url.startswith("http://[::1]:")
        assert server.client().get("/v1/models").status_code == 200
        assert server.stop() == 0


def test_auto_says_why_it_held_back_in_whole_and_streamed_replies(fixture_models, plain_server,
                                                                 tmp_path) -> None:
    """`-k auto` with n-gram lookup on a text it has nothing to copy from (the fixture target's first 12
    tokens at T 0 repeat nothing): nothing is drafted, and the reply's figures say why, whole and on the
    stream's last chunk; `draft_n` is there, 0 of 0. Without a drafter neither is."""
    request = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "seed": 1, "speculative.n_max": "auto"}
    with ServerProcess("--target", str(fixture_models.target), "--draft", "ngram", "-t", "1",
                       cwd=tmp_path) as server:
        server.ready()
        with server.client() as http:
            whole = http.post("/v1/completions", json=request)
            assert whole.status_code == 200, whole.text
            streamed = data_lines(http.post("/v1/completions", json={**request, "stream": True}).iter_lines())
        assert server.stop() == 0
    for figures in (whole.json(), streamed[-1]):
        timings, speculation = figures["timings"], figures["speculation"]
        assert timings["predicted_n"] == 12 and [timings["draft_n"], timings["draft_n_accepted"]] == [0, 0]
        reason, holdback = speculation["auto_reason"], speculation["auto_holdback"]
        assert isinstance(reason, str) and reason.strip() and "\n" not in reason, speculation
        assert holdback["text"] == reason and speculation["drafter"] == "ngram"
        assert holdback["cause"] in ("nothing", "declined", "hopeless", "unmeasured")
        assert 2 * holdback["plain_rounds"] > holdback["rounds"] > 0
    assert all("timings" not in chunk for chunk in streamed[:-1])
    with plain_server.client() as http:
        plain = http.post("/v1/completions", json=request).json()
    assert "draft_n" not in plain["timings"] and plain["speculation"]["auto_reason"] is None


def test_speculative_p_min_is_per_request(pair_server) -> None:
    client = client_for(pair_server)

    def drafted(**speculative) -> int:
        reply = client.completions.create(model="m", prompt=PROMPT, max_tokens=24, seed=3, temperature=0,
                                          extra_body={"speculative.n_max": 3, **speculative})
        return reply.model_extra["timings"].get("draft_n", 0)

    before = drafted()
    gated = drafted(**{"speculative.p_min": 1.0})
    assert gated < before and drafted() == before  # the server's own p_min again for the next request


def test_llama_servers_spellings_of_the_speculation_fields(pair_server) -> None:
    """`speculative.n_max` as llama-server writes it (a dotted key) or nested, a number or "auto";
    `n_predict` before `max_completion_tokens` before `max_tokens`."""
    with pair_server.client() as http:
        def timings(**fields) -> dict:
            response = http.post("/v1/completions", json={"prompt": PROMPT, "seed": 1, "temperature": 0,
                                                          "max_tokens": 16, **fields})
            assert response.status_code == 200, response.text
            return response.json()["timings"]

        dotted = timings(**{"speculative.n_max": 3})
        nested = timings(speculative={"n_max": 3})
        drafting = ("draft_n", "draft_n_accepted")
        assert [nested[k] for k in drafting] == [dotted[k] for k in drafting]
        assert dotted["draft_n"] > 0
        undrafted = timings(**{"speculative.n_max": 0})  # a drafter is loaded: its figures are there
        assert [undrafted[k] for k in drafting] == [0, 0]
        assert timings(**{"speculative.n_max": "auto"})["predicted_n"] == 16
        assert timings(max_tokens=16, max_completion_tokens=9)["predicted_n"] == 9
        assert timings(max_completion_tokens=9, n_predict=5)["predicted_n"] == 5


# -- batch 1: concurrency, disconnects, memory ----------------------------------------------------------


def test_four_clients_at_once_each_get_their_own_text(pair_server) -> None:
    requests = [(PROMPT, 1), ("The dog", 2), ("Pip was", 3), ("The boat", 4)]

    def alone(prompt: str, seed: int) -> str:
        return client_for(pair_server).completions.create(
            model="m", prompt=prompt, max_tokens=40, seed=seed, temperature=0.8).choices[0].text

    def streamed(prompt: str, seed: int) -> str:
        chunks = client_for(pair_server).completions.create(
            model="m", prompt=prompt, max_tokens=40, seed=seed, temperature=0.8, stream=True)
        return "".join(c.choices[0].text for c in chunks)

    expected = [alone(*r) for r in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda r: streamed(*r), requests))
    assert together == expected and len(set(expected)) == len(expected)


def test_a_client_that_goes_away_stops_its_generation(pair_server) -> None:
    start = len(pair_server.lines)
    with pair_server.client() as http:
        body = {"prompt": PROMPT, "max_tokens": LONG, "ignore_eos": True, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as response:
            seen = 0
            for line in response.iter_lines():
                seen += line.startswith("data: {")
                if seen == 3:
                    break  # leaving the block closes the connection mid-stream
    match = pair_server.wait_for(r"cmpl-\w+: .* · (\d+) tokens · .*stop: interrupted \(client gone\)",
                                 start=start)
    assert int(match.group(1)) < LONG
    reply = client_for(pair_server).completions.create(model="m", prompt=PROMPT, max_tokens=8, seed=1)
    assert reply.choices[0].finish_reason == "length"


def test_resident_memory_stays_flat_over_50_requests(pair_server) -> None:
    client = client_for(pair_server)

    def one(i: int) -> None:
        if i % 2:
            chunks = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"Story {i}: {PROMPT}"}], max_tokens=24,
                seed=i, stream=True, stream_options={"include_usage": True})
            assert list(chunks)[-1].usage.completion_tokens == 24
        else:
            assert client.completions.create(model="m", prompt=f"{i} {PROMPT}", max_tokens=24,
                                             seed=i).usage.completion_tokens == 24

    for i in range(10):
        one(i)
    before = pair_server.rss_kib()
    for i in range(10, 50):
        one(i)
    after = pair_server.rss_kib()
    # Generous: allocator noise is a few MiB; a leak of a generation's events or stats per request would
    # show as steady growth well past it.
    assert after - before < 24 * 1024, f"resident memory grew from {before} to {after} KiB over 40 requests"


def test_a_full_queue_answers_503_and_cancel_stops_a_running_reply(fixture_models, tmp_path) -> None:
    with ServerProcess("--target", str(fixture_models.target), "--no-draft", "-t", "1", "-c", "8192",
                       "--queue", "1", cwd=tmp_path) as server:
        server.ready()
        http = server.client()
        long = {"prompt": PROMPT, "max_tokens": LONG, "ignore_eos": True, "stream": True}
        with http.stream("POST", "/v1/completions", json=long) as running, ThreadPoolExecutor(1) as pool:
            lines = running.iter_lines()
            first = next(json.loads(line[6:]) for line in lines if line.startswith("data: {"))
            waiting = pool.submit(lambda: server.client().post("/v1/completions", json={
                "prompt": PROMPT, "max_tokens": 8}))
            wait_until(lambda: http.get("/health").json()["waiting"] == 1, "the second request waits")
            refused = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8})
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
            assert refused.json()["error"]["code"] == "queue_full"
            assert http.post("/specli/cancel/cmpl-nosuch").status_code == 404
            assert http.post(f"/specli/cancel/{first['id']}").json() == {"id": first["id"], "cancelled": True}
            last = data_lines(lines)[-1]  # the stream ends as usual, with the figures of what it generated
            assert last["choices"][0]["finish_reason"] == "stop"
            assert last["speculation"]["stop_reason"] == "interrupted"
            assert last["timings"]["predicted_n"] < LONG
            served = waiting.result(timeout=120)
        assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 8
        assert server.stop() == 0


# -- errors ---------------------------------------------------------------------------------------------

CHAT = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}

BAD_REQUESTS = [
    # (what, method, path, body, status, code, param)
    ("malformed JSON", "POST", "/v1/chat/completions", b'{"messages": [', 400, "invalid_json", None),
    ("not an object", "POST", "/v1/completions", b"[1, 2]", 400, "invalid_json", None),
    ("not UTF-8", "POST", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, "invalid_json", None),
    ("a wrong type", "POST", "/v1/chat/completions", {**CHAT, "temperature": "hot"}, 400, "invalid_value",
     "temperature"),
    ("out of range", "POST", "/v1/chat/completions", {**CHAT, "top_p": 1.5}, 400, "invalid_value", "top_p"),
    ("k out of range", "POST", "/v1/chat/completions", {**CHAT, "speculative.n_max": 65}, 400,
     "invalid_value", "speculative.n_max"),
    ("a zero length", "POST", "/v1/chat/completions", {**CHAT, "max_completion_tokens": 0}, 400,
     "invalid_value", "max_completion_tokens"),
    ("a seed too big", "POST", "/v1/completions", {"prompt": PROMPT, "seed": 2**40}, 400, "invalid_value",
     "seed"),
    ("stream not a boolean", "POST", "/v1/chat/completions", {**CHAT, "stream": "yes"}, 400, "invalid_type",
     "stream"),
    ("n > 1", "POST", "/v1/chat/completions", {**CHAT, "n": 2}, 400, "unsupported_value", "n"),
    ("no messages", "POST", "/v1/chat/completions", {"model": "m"}, 400, "missing_required_parameter",
     "messages"),
    ("a message without a role", "POST", "/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400,
     "invalid_type", "messages[0].role"),
    ("an image", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "unsupported_value",
     "messages[0].content[0]"),
    ("an empty prompt", "POST", "/v1/completions", {"prompt": ""}, 400, "invalid_value", "prompt"),
    ("a token id outside the vocabulary", "POST", "/v1/completions", {"prompt": [1, 10**6]}, 400,
     "invalid_value", "prompt"),
    ("a prompt longer than the context", "POST", "/v1/completions", {"prompt": "Once upon a time " * 4000},
     400, "context_length_exceeded", "prompt"),
    ("a conversation longer than the context", "POST", "/v1/chat/completions", {"messages": [
        {"role": "user", "content": "Once upon a time " * 4000}]}, 400, "context_length_exceeded",
     "messages"),
    # Lone surrogates (JSON escapes of half a character) anywhere: in a prompt, a message, a stop, a role.
    ("a lone surrogate in a prompt", "POST", "/v1/completions", b'{"prompt": "a\\ud800b"}', 400,
     "invalid_value", "prompt"),
    ("a lone surrogate in a message", "POST", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "x\\udfffy"}]}', 400, "invalid_value",
     "messages[0].content"),
    ("a lone surrogate in stop", "POST", "/v1/completions", b'{"prompt": "a", "stop": ["\\ud800"]}', 400,
     "invalid_value", "stop[0]"),
    ("a lone surrogate in a role", "POST", "/v1/chat/completions",
     b'{"messages": [{"role": "us\\ud800er", "content": "hi"}]}', 400, "invalid_value", "messages[0].role"),
    # Every length field is checked, not only the one that applies.
    ("a weaker length field that is wrong", "POST", "/v1/chat/completions",
     {**CHAT, "max_completion_tokens": 3, "max_tokens": "abc"}, 400, "invalid_value", "max_tokens"),
    ("a negative weaker length", "POST", "/v1/completions",
     {"prompt": PROMPT, "n_predict": 3, "max_tokens": -5}, 400, "invalid_value", "max_tokens"),
    ("speculative not an object", "POST", "/v1/completions", {"prompt": PROMPT, "speculative": 5}, 400,
     "invalid_type", "speculative"),
    ("best_of a boolean", "POST", "/v1/completions", {"prompt": PROMPT, "best_of": True}, 400,
     "unsupported_value", "best_of"),
    ("UTF-16", "POST", "/v1/completions", json.dumps({"prompt": PROMPT}).encode("utf-16-le"), 400,
     "invalid_json", None),
    ("UTF-32 with its mark", "POST", "/v1/completions", json.dumps({"prompt": PROMPT}).encode("utf-32"), 400,
     "invalid_json", None),
    ("a byte order mark", "POST", "/v1/completions",
     b"\xef\xbb\xbf" + json.dumps({"prompt": PROMPT}).encode(), 400, "invalid_json", None),
    ("cache_prompt not a boolean", "POST", "/v1/completions", {"prompt": PROMPT, "cache_prompt": "no"}, 400,
     "invalid_type", "cache_prompt"),
    ("an unknown route", "POST", "/v1/nothing", {}, 404, "unknown_url", None),
    ("a wrong method", "GET", "/v1/chat/completions", None, 405, "method_not_allowed", None),
    ("a wrong method on the models", "DELETE", "/v1/models", None, 405, "method_not_allowed", None),
]


@pytest.mark.parametrize("what,method,path,body,status,code,param", BAD_REQUESTS,
                         ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_openais_error_shape(pair_server, what, method, path, body, status, code,
                                              param) -> None:
    with pair_server.client() as http:
        content = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        response = http.request(method, path, content=content, headers=headers)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert (error["code"], error["param"]) == (code, param)
        if status == 405:
            assert "POST" in response.headers["allow"] or "GET" in response.headers["allow"]
        assert http.get("/health").json()["status"] == "ok"


def test_a_body_over_the_limit_is_413_before_it_is_read(pair_server) -> None:
    """Declared too big: answered at once (a raw socket, so the client sends only the headers)."""
    host, port = pair_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000000\r\n\r\n{\"prompt\": \"")
        response = b""
        while b"\r\n\r\n" not in response or not response.rstrip().endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            response += data
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert client_for(pair_server).completions.create(model="m", prompt=PROMPT, max_tokens=2).choices[0].text


def test_errors_keep_the_server_serving(pair_server) -> None:
    """After every class of bad request above, a good one is served as usual."""
    with pair_server.client() as http:
        for _, method, path, body, *_ in BAD_REQUESTS:
            http.request(method, path, content=body if isinstance(body, bytes) or body is None
                         else json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        reply = http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 6})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 6


# -- the API key, signals, the command line -------------------------------------------------------------


def test_an_api_key_guards_the_api_but_not_the_page_or_health(fixture_models, tmp_path) -> None:
    with ServerProcess("--target", str(fixture_models.target), "--no-draft", "-t", "1", cwd=tmp_path,
                       env={"SPECLI_API_KEY": "s3cret"}) as server:
        server.ready()
        with server.client() as http:
            assert http.get("/health").json()["status"] == "ok"
            assert "<title>specli</title>" in http.get("/").text
            assert http.get("/static/app.js").status_code == 200
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"),
                                     ("GET", "/specli/props")):
                    response = http.request(method, path, headers=headers, json={"prompt": PROMPT})
                    assert response.status_code == 401, (method, path, headers)
                    assert response.json()["error"]["code"] == "invalid_api_key"
            props = http.get("/specli/props", headers={"Authorization": "Bearer s3cret"}).json()
            assert props["model"] == "fixture-target" and props["drafter"] is None
        good = client_for(server, "s3cret")
        assert [m.id for m in good.models.list()] == ["fixture-target"]
        assert good.completions.create(model="m", prompt=PROMPT, max_tokens=3).usage.completion_tokens == 3
        with pytest.raises(openai.AuthenticationError):
            client_for(server, "wrong").completions.create(model="m", prompt=PROMPT, max_tokens=3)
        assert server.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_ends_the_running_generation_and_exits_0(fixture_models, tmp_path, sig) -> None:
    with ServerProcess("--target", str(fixture_models.target), "--draft", str(fixture_models.draft),
                       "-t", "1", "-c", "8192", cwd=tmp_path) as server:
        server.ready()
        with server.client() as http:
            body = {"prompt": PROMPT, "max_tokens": LONG, "ignore_eos": True, "stream": True}
            with http.stream("POST", "/v1/completions", json=body) as response:
                lines = response.iter_lines()
                next(line for line in lines if line.startswith("data: {"))
                server.proc.send_signal(sig)
                last = data_lines(lines)[-1]
        assert last["speculation"]["stop_reason"] == "interrupted" and last["timings"]["predicted_n"] < LONG
        assert server.stop(sig) == 0
        assert "stop: interrupted (server stopping)" in server.stderr
        assert server.lines[-1].startswith("specli: stopped (1 generations served)")
        assert "Traceback" not in server.stderr


def test_health_is_503_while_the_models_load(fixture_models) -> None:
    """In process: a load held back until the test has seen /health and a completion refused."""
    from starlette.testclient import TestClient

    from specli.serve.app import ServeOptions, Service, create_app

    release = threading.Event()

    def load():
        assert release.wait(60)
        return specli.load(fixture_models.target, n_ctx=256, n_threads=1)

    service = Service(defaults_for("serve"), ServeOptions("tiny"), load, log=lambda line: None)
    with TestClient(create_app(service), base_url="http://127.0.0.1") as http:
        service.worker.start()
        try:
            loading = http.get("/health")
            assert loading.status_code == 503 and loading.json()["status"] == "loading"
            refused = http.post("/v1/completions", json={"prompt": PROMPT})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "loading"
            assert refused.headers["retry-after"]
            release.set()
            wait_until(lambda: http.get("/health").status_code == 200, "the model loaded")
            reply = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
            assert reply.json()["usage"]["completion_tokens"] == 3
        finally:
            release.set()
            assert service.worker.close(60)
    assert service.worker.state == "stopped" and service.worker.spec is None


def _one_line_error(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert proc.returncode == code, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("specli: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], proc.stderr


def _serve(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, "serve", *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def test_a_port_in_use_is_a_one_line_error(fixture_models, tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _serve("--target", str(fixture_models.target), "--host", "127.0.0.1", "--port", str(port),
                      cwd=tmp_path)
    _one_line_error(proc, 1, f"cannot listen on 127.0.0.1:{port}")


def test_models_that_cannot_load_are_a_one_line_error(fixture_models, tmp_path) -> None:
    proc = _serve("--target", str(fixture_models.target), "--draft", str(fixture_models.other_vocab),
                  "--host", "127.0.0.1", "--port", "0", cwd=tmp_path)
    _one_line_error(proc, 1, "vocabular")


@pytest.mark.parametrize("args,fragment", [
    ((), "give the target once"),
    (("--temp", "-1"), "--temp"),
    (("--draft-max", "65"), "--draft-max"),
    (("--port", "70000"), "--port"),
    (("--queue", "-1"), "--queue"),
    (("--alias", " "), "--alias"),
    # API keys no client could send (or that silently mean none): refused before anything loads.
    (("--api-key", "clé-ключ"), "printable ASCII"),
    (("--api-key", " spaced "), "space"),
    (("--api-key", ""), "empty"),
    (("--allow-origin", "evil"), "--allow-origin"),
    (("--read-timeout", "0"), "--read-timeout"),
], ids=["no target", "temp", "k", "port", "queue", "alias", "non-ASCII key", "spaced key", "empty key",
        "bad origin", "read timeout"])
def test_usage_errors_exit_2(fixture_models, tmp_path, args, fragment) -> None:
    target = ("--target", str(fixture_models.target)) if args else ()
    port = () if "--port" in args else ("--port", "0")
    _one_line_error(_serve(*target, *args, "--host", "127.0.0.1", *port, cwd=tmp_path), 2, fragment)


def test_an_empty_api_key_variable_is_an_error_not_an_open_server(fixture_models, tmp_path) -> None:
    command = [EXE, "serve", "--target", str(fixture_models.target), "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, env={**os.environ, "SPECLI_API_KEY": ""})
    _one_line_error(proc, 2, "SPECLI_API_KEY")


def test_listening_beyond_loopback_warns() -> None:
    from specli.serve.server import is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.org"))


# -- the package ----------------------------------------------------------------------------------------


def test_the_core_never_imports_the_server() -> None:
    package = Path(specli.__file__).parent
    for path in package.rglob("*.py"):
        inside = path.is_relative_to(package / "serve") or path.name == "cli.py"
        assert inside or "specli.serve" not in path.read_text(encoding="utf-8"), path


def test_the_page_ships_as_package_data() -> None:
    """setuptools installs files beside the code only when package-data names them: every file of the
    page must match a pattern there (a non-editable install would miss it otherwise)."""
    import fnmatch

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    root = Path(specli.__file__).parents[1]
    if not (root / "pyproject.toml").is_file():
        pytest.skip("specli is installed from a wheel: its files are what the wheel holds")
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    serve = root / "specli" / "serve"
    files = [p.relative_to(serve).as_posix() for p in (serve / "static").iterdir()]
    assert {"static/index.html", "static/app.js", "static/style.css"} <= set(files)
    for name in files:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns["specli.serve"]), name


def test_the_model_list_in_openais_shape(pair_server) -> None:
    """/v1/models in OpenAI's shape (read by plain HTTP, as a client without the openai package would)."""
    models = httpx.get(pair_server.url + "/v1/models", timeout=60).json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [
        ("fixture-target-chat", "model", "specli")]
