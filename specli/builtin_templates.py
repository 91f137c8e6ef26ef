"""llama.cpp's own built-in chat formats (`gemma`, `llama3`, `chatml` ...), for models whose GGUF
carries no chat template."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp as llc

from specli.llama import LlamaError


def builtin_chat_template(name: str, messages: Sequence[tuple[str, str]], add_generation_prompt: bool) -> str:
    """`messages` (role, content) rendered in llama.cpp's own built-in chat format `name` (`gemma`,
    `llama3`, `chatml` ...: llama_chat_builtin_templates); LlamaError for a name llama.cpp does not
    know. Nothing is added for BOS: the tokenizer adds it."""
    chat = (llc.llama_chat_message * max(1, len(messages)))()
    encoded = [(role.encode(), content.encode()) for role, content in messages]  # kept alive for the call
    for i, (role, content) in enumerate(encoded):
        chat[i].role, chat[i].content = role, content
    size = 256 + 2 * sum(len(r) + len(c) for r, c in encoded)
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llc.llama_chat_apply_template(name.encode(), chat, len(encoded), add_generation_prompt, buf, size)
        if n < 0:
            raise LlamaError(f"llama.cpp has no built-in chat format {name!r}")
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n + 1
    raise LlamaError(f"llama.cpp's chat format {name!r} did not fit {size} bytes")
