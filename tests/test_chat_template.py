# ruff: noqa: E501  -- the real-world templates below are kept verbatim, long lines included.
from __future__ import annotations

from datetime import datetime
from types import MappingProxyType

import pytest

from specli.chat.prompt import build_chat_template
from specli.chat_template import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from specli.llama import Model, ModelOptions
from specli_synth.fixtures import FIXTURE_CHAT_TEMPLATE

# --- Real-world templates, as shipped in the models' tokenizer_config.json / GGUF metadata ---

QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)

PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)

QWEN_BOS, QWEN_EOS = "<|endoftext|>", "<|im_end|>"
LLAMA3_BOS, LLAMA3_EOS = "<|begin_of_text|>", "<|eot_id|>"
MISTRAL_BOS, MISTRAL_EOS = "<s>", "</s>"


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


# --- Rendering ---


def test_qwen2_default_system_message() -> None:
    t = ChatTemplate.from_strings(QWEN2_TEMPLATE, QWEN_BOS, QWEN_EOS)
    assert not t.is_fallback
    out = t.render([user("Hi")])
    assert out == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert not t.starts_with_bos(out)


def test_qwen2_explicit_system_message() -> None:
    t = ChatTemplate.from_strings(QWEN2_TEMPLATE, QWEN_BOS, QWEN_EOS)
    out = t.render([{"role": "system", "content": "Be terse."}, user("Hi")], add_generation_prompt=False)
    assert out == "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_llama3_render_and_bos() -> None:
    t = ChatTemplate.from_strings(LLAMA3_TEMPLATE, LLAMA3_BOS, LLAMA3_EOS)
    out = t.render([{"role": "system", "content": "Sys"}, user("  Hello  ")])
    assert out == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert t.starts_with_bos(out)


def test_llama31_render() -> None:
    t = ChatTemplate.from_strings(LLAMA31_TEMPLATE, LLAMA3_BOS, LLAMA3_EOS)
    out = t.render([user("Hi")])
    assert out == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert t.starts_with_bos(out)
    # Extra template variables pass through.
    assert "Today Date: 1 Jan 2030" in t.render([user("Hi")], date_string="1 Jan 2030")


def test_llama31_tools_use_hf_tojson() -> None:
    t = ChatTemplate.from_strings(LLAMA31_TEMPLATE, LLAMA3_BOS, LLAMA3_EOS)
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Météo <now> & later"}}
    out = t.render([user("Weather?")], tools=[tool])
    assert "Environment: ipython\n" in out
    # indent=4, no ASCII escaping, no HTML escaping.
    assert '{\n    "type": "function",' in out
    assert "Météo <now> & later" in out
    assert out.endswith("Weather?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_mistral_render() -> None:
    t = ChatTemplate.from_strings(MISTRAL_TEMPLATE, MISTRAL_BOS, MISTRAL_EOS)
    out = t.render([user("Hi"), assistant("Hello"), user("Bye")])
    assert out == "<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]"
    assert t.starts_with_bos(out)


def test_mistral_non_alternating_roles_raise() -> None:
    t = ChatTemplate.from_strings(MISTRAL_TEMPLATE, MISTRAL_BOS, MISTRAL_EOS)
    with pytest.raises(ChatTemplateError) as info:
        t.render([user("a"), user("b")])
    assert str(info.value) == "Conversation roles must alternate user/assistant/user/assistant/..."
    with pytest.raises(ChatTemplateError, match="Only user and assistant roles are supported!"):
        t.render([user("a"), {"role": "system", "content": "x"}])


def test_gemma_render() -> None:
    t = ChatTemplate.from_strings(GEMMA_TEMPLATE, "<bos>", "<eos>")
    out = t.render([user("Hi"), assistant("Hey"), user("Ok")])
    assert out == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHey<end_of_turn>\n"
        "<start_of_turn>user\nOk<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(ChatTemplateError, match="^System role not supported$"):
        t.render([{"role": "system", "content": "s"}, user("Hi")])


@pytest.mark.parametrize("template", [QWEN2_TEMPLATE, LLAMA3_TEMPLATE, PHI3_TEMPLATE, None])
def test_add_generation_prompt_on_off(template: str | None) -> None:
    t = ChatTemplate.from_strings(template, "<bos>", "<eos>")
    msgs = [user("Hi")]
    on = t.render(msgs, add_generation_prompt=True)
    off = t.render(msgs, add_generation_prompt=False)
    assert on != off
    suffix = {
        QWEN2_TEMPLATE: "<|im_start|>assistant\n",
        LLAMA3_TEMPLATE: "<|start_header_id|>assistant<|end_header_id|>\n\n",
        PHI3_TEMPLATE: "<|assistant|>\n",
        None: "<|im_start|>assistant\n",
    }[template]
    assert on.endswith(suffix)
    assert not off.endswith(suffix)
    if template is not PHI3_TEMPLATE:  # Phi-3 appends EOS instead when the prompt is off
        assert on == off + suffix


def test_default_add_generation_prompt_is_true() -> None:
    t = ChatTemplate.from_strings(None, "", "")
    assert t.render([user("x")]).endswith("<|im_start|>assistant\n")


# --- Fallback ---


def test_fallback_chatml() -> None:
    t = ChatTemplate.from_strings(None, "<s>", "</s>")
    assert t.is_fallback
    assert t.source == CHATML_TEMPLATE
    out = t.render([{"role": "system", "content": "S"}, user("Hi"), assistant("Yo"), user("Q")])
    assert out == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not t.starts_with_bos(out)
    assert t.stop_strings() == ["<|im_end|>"]


def test_empty_template_is_fallback() -> None:
    assert ChatTemplate.from_strings("   ", "", "").is_fallback


def test_template_comes_from_the_gguf(fixture_models) -> None:
    """What chat uses: the template that llama.cpp reads from tokenizer.chat_template, rendered with the
    vocabulary's BOS/EOS texts; a model without one gets ChatML and a notice saying so."""
    options = ModelOptions(n_ctx=256, n_threads=1)
    with Model(fixture_models.target_with_template, options) as model:
        t, notice = build_chat_template(model)
    assert not t.is_fallback and t.source == FIXTURE_CHAT_TEMPLATE and notice is None
    assert (t.bos_token, t.eos_token) == ("<s>", "</s>")
    with Model(fixture_models.target, options) as model:
        t, notice = build_chat_template(model)
    assert t.is_fallback and t.source == CHATML_TEMPLATE
    assert notice is not None and "no chat template" in notice


# --- Prefix property across turns (KV-cache reuse) ---


@pytest.mark.parametrize(
    ("template", "bos", "eos"),
    [
        (QWEN2_TEMPLATE, QWEN_BOS, QWEN_EOS),
        (LLAMA3_TEMPLATE, LLAMA3_BOS, LLAMA3_EOS),
        (LLAMA31_TEMPLATE, LLAMA3_BOS, LLAMA3_EOS),
        (MISTRAL_TEMPLATE, MISTRAL_BOS, MISTRAL_EOS),
        (GEMMA_TEMPLATE, "<bos>", "<eos>"),
        (PHI3_TEMPLATE, "<s>", "<|endoftext|>"),
        (None, "", ""),
    ],
)
def test_prefix_property_two_turns(template: str | None, bos: str, eos: str) -> None:
    t = ChatTemplate.from_strings(template, bos, eos)
    history = [user("What is 2+2?")]
    p1 = t.render(history)
    reply = "2+2 is 4."
    history += [assistant(reply), user("And 3+3?")]
    p2 = t.render(history)
    assert p2.startswith(p1 + reply)
    # Third turn keeps extending the second.
    history += [assistant("6.")]
    history += [user("Thanks")]
    p3 = t.render(history)
    assert p3.startswith(p2 + "6.")


def test_rendering_is_deterministic() -> None:
    tmpl = "{{ strftime_now('%Y-%m-%d %H:%M:%S.%f') }}|{{ messages[0].content }}"
    t = ChatTemplate.from_strings(tmpl, "", "")
    assert t.render([user("a")]) == t.render([user("a")])
    fixed = ChatTemplate.from_strings(tmpl, "", "", now=datetime(2024, 7, 26, 12, 0, 0))
    assert fixed.render([user("a")]) == "2024-07-26 12:00:00.000000|a"


def test_cache_keeps_the_longest_common_token_prefix(fixture_models) -> None:
    """What the prefix property buys: the engine keeps the cache's longest common prefix with the next
    prompt (Model.keep_common_prefix), leaving the prompt's last token to be decoded again."""
    with Model(fixture_models.target, ModelOptions(n_ctx=256, n_threads=1)) as model:
        cached = model.tokenize("Once upon a time, there was a little fox named Pip.")
        assert len(cached) >= 6

        def refill() -> None:
            model.decode(cached[model.n_past :])
            assert model.tokens == cached

        refill()
        other = next(t for t in cached if t != cached[4])
        assert model.keep_common_prefix([*cached[:4], other, *cached[5:]]) == 4  # diverges at 4
        assert model.tokens == cached[:4]
        refill()
        assert model.keep_common_prefix([*cached, *cached[1:4]]) == len(cached)  # extends the cache
        assert model.keep_common_prefix(cached) == len(cached) - 1  # the same prompt: its last token again
        assert model.tokens == cached[:-1]
        refill()
        first = next(t for t in cached if t != cached[0])
        assert model.keep_common_prefix([first, *cached[1:]]) == 0
        assert model.n_past == 0


# --- Stop strings ---


@pytest.mark.parametrize(
    ("template", "eos", "expected"),
    [
        (QWEN2_TEMPLATE, QWEN_EOS, ["<|im_end|>"]),
        (LLAMA3_TEMPLATE, LLAMA3_EOS, ["<|eot_id|>"]),
        (LLAMA31_TEMPLATE, LLAMA3_EOS, ["<|eot_id|>", "<|eom_id|>"]),
        (PHI3_TEMPLATE, "<|endoftext|>", ["<|end|>", "<|endoftext|>"]),
        (GEMMA_TEMPLATE, "<eos>", ["<end_of_turn>"]),
        (MISTRAL_TEMPLATE, MISTRAL_EOS, []),  # plain-text "</s>" is not used as a stop string
        (
            "{{ '<|start|>assistant<|channel|>final<|message|>' + messages[0].content + '<|end|>' }}",
            "<|return|>",
            ["<|return|>", "<|call|>"],
        ),
    ],
)
def test_stop_strings(template: str, eos: str, expected: list[str]) -> None:
    assert ChatTemplate.from_strings(template, "<bos>", eos).stop_strings() == expected


def test_stop_strings_header_tokens_not_confused_with_end() -> None:
    # "<|end_header_id|>" must not be mistaken for Phi-3's "<|end|>".
    assert "<|end|>" not in ChatTemplate.from_strings(LLAMA3_TEMPLATE, "", "").stop_strings()


# --- Environment features and errors ---


def test_tojson_filter_hf_behaviour() -> None:
    tmpl = "{{ messages[0] | tojson }}#{{ {'a': [1, 2]} | tojson(indent=2) }}"
    out = ChatTemplate.from_strings(tmpl, "", "").render([user("é <b> & 'q'")])
    first, second = out.split("#")
    assert first == '{"role": "user", "content": "é <b> & \'q\'"}'
    assert second == '{\n  "a": [\n    1,\n    2\n  ]\n}'


def test_trim_and_lstrip_blocks() -> None:
    tmpl = "{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}"
    out = ChatTemplate.from_strings(tmpl, "", "").render([user("a"), user("b")])
    assert out == "[a]\n[b]\n"


def test_loopcontrols_and_generation_tag() -> None:
    tmpl = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}"
    )
    out = ChatTemplate.from_strings(tmpl, "", "").render([user("a"), user("b"), user("c")])
    assert out == "<a><b>"


def test_messages_may_be_any_mapping_and_no_template_is_chatml() -> None:
    t = ChatTemplate.from_strings(QWEN2_TEMPLATE, QWEN_BOS, QWEN_EOS)
    assert t.render([MappingProxyType(user("Hi"))]) == t.render([user("Hi")])
    chatml = ChatTemplate.from_strings(None, "", "")
    assert chatml.render([user("Hi")]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_syntax_error_is_one_line() -> None:
    with pytest.raises(ChatTemplateError) as info:
        ChatTemplate.from_strings("{% for m in messages %}\n{{ m.content }}\n", "", "")
    msg = str(info.value)
    assert msg.startswith("invalid chat template:")
    assert "\n" not in msg


def test_render_errors_are_wrapped() -> None:
    t = ChatTemplate.from_strings("{{ messages[0].content + 1 }}", "", "")
    with pytest.raises(ChatTemplateError, match="failed to render"):
        t.render([user("x")])
    sandboxed = ChatTemplate.from_strings("{{ messages.append(1) }}", "", "")
    with pytest.raises(ChatTemplateError):
        sandboxed.render([user("x")])


def test_bad_messages() -> None:
    t = ChatTemplate.from_strings(None, "", "")
    with pytest.raises(ChatTemplateError, match="message 0"):
        t.render([{"content": "no role"}])
    with pytest.raises(ChatTemplateError, match="message 1"):
        t.render([user("ok"), "not a message"])  # type: ignore[list-item]


def test_long_raise_message_is_truncated_single_line() -> None:
    t = ChatTemplate.from_strings("{{ raise_exception('line one\\nline two ' * 100) }}", "", "")
    with pytest.raises(ChatTemplateError) as info:
        t.render([user("x")])
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("line one line two") and len(msg) <= 300


# -- a template from a downloaded file must not be able to hang specli, nor write to the terminal --------

COSTLY_TEMPLATES = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "huge power": "{{ 2 ** 99999999999 }}",
    "repeated string": "{{ 'x' * 10000000000 }}",
    "repeated list": "{{ ([1] * 1000000000)|length }}",
    "center filter": "{{ 'x'|center(1000000000) }}",
    "str method": "{{ 'x'.ljust(1000000000) }}",
    "replace": "{% set a = 'a' * 100000 %}{{ a.replace('a', a) }}",
    "replace filter": "{% set a = 'a' * 100000 %}{{ a|replace('a', a) }}",
    "printf width": "{{ '%0999999999d' % 1 }}",
    "printf width argument": "{{ '%*d' % (999999999, 1) }}",
    "format filter": "{{ '%0999999999d'|format(1) }}",
    "str.format width": "{{ '{:999999999}'.format(1) }}",
    "str.format width argument": "{{ '{:{}}'.format(1, 999999999) }}",
    "indent": "{{ 'a\nb'|indent(1000000000) }}",
    "expandtabs": "{{ ('\t' * 1000).expandtabs(100000) }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
}


@pytest.mark.parametrize("source", COSTLY_TEMPLATES.values(), ids=COSTLY_TEMPLATES.keys())
def test_a_template_that_would_not_end_is_stopped(source: str) -> None:
    """A huge loop (hours), or one C-level operation making gigabytes: each render is bounded (a line
    budget for Python code, size checks where Python works in C), and fails like a broken template."""
    with pytest.raises(ChatTemplateError, match="chat template (stopped|failed to render)"):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


def test_ordinary_widths_and_repeats_still_render() -> None:
    source = ("{{ '{} {:5}|'.format(1234567890123, 'ab') }}{{ '%5d|%s' % (3, 'x') }}{{ 'a'|center(5) }}"
              "{{ '-' * 3 }}{{ 2 ** 10 }}{% for m in messages %}{{ m.content|indent(2) }}{% endfor %}")
    out = ChatTemplate(source).render([{"role": "user", "content": "a\nb"}])
    assert out == "1234567890123 ab   |    3|x  a  ---1024a\n  b"


def test_template_error_text_cannot_drive_the_terminal() -> None:
    """A template's error text with escape codes (colours, a window title, a newline) was written raw."""
    source = "{{ raise_exception('\x1b[31mred\x1b]0;title\x07\nsecond line\u202e') }}"
    with pytest.raises(ChatTemplateError) as info:
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
    message = str(info.value)
    assert message.isprintable()
    assert "\\x1b[31mred" in message and "\\u202e" in message

