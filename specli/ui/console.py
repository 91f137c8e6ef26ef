"""Consoles for every front end: rich markup stays available for our own messages, but emoji codes
(:heart:) are never substituted and nothing is highlighted. Text from the user, a file or a model is
passed as rich.text.Text (or through rich.markup.escape), never as a markup string."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def make_console(*, stderr: bool = False, **kwargs: Any) -> Console:
    return Console(stderr=stderr, highlight=False, emoji=False, **kwargs)
