"""Consoles for every front end: rich markup stays available for our own messages, but emoji codes
(:heart:) are never substituted and nothing is highlighted. Text from the user, a file or a model is
passed as rich.text.Text (or through rich.markup.escape), never as a markup string.

Whether a console is a terminal is the stream's own answer (isatty), not rich's: FORCE_COLOR (common in
CI) would make rich treat a redirected stdout as a terminal, and the live view, the legend and ANSI codes
would go into a file that must hold plain text."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.text import Text


def is_a_terminal(stream: Any) -> bool:
    try:
        return stream is not None and bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed or not a real stream
        return False


def make_console(*, stderr: bool = False, **kwargs: Any) -> Console:
    stream = kwargs.get("file") or (sys.stderr if stderr else sys.stdout)
    kwargs.setdefault("force_terminal", is_a_terminal(stream))
    return Console(stderr=stderr, highlight=False, emoji=False, **kwargs)


def shows_styles(console: Console) -> bool:
    """Whether colours reach the reader (not TERM=dumb, not NO_COLOR, a terminal at all)."""
    return console.color_system is not None and not console.no_color


def note(console: Console, text: str) -> None:
    """A yellow "note:" and `text`, as one line (also on a pipe, however long)."""
    console.print(Text.assemble(("note: ", "yellow"), text), soft_wrap=True)
