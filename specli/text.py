"""Text from a file, a model or the user, made safe to print on a terminal in a message: control
characters (an escape sequence can recolour, move or retitle a terminal; a newline breaks "one line")
and invisible format characters (a right-to-left override reorders what follows) are shown as escapes.
Generated text is the output, not a message, and is never changed."""

from __future__ import annotations

import unicodedata


def printable(text: str) -> str:
    """`text` with every control or format character written as a Python escape (\\x1b, \\n, \\u202e)."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch == " " or unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp"):
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)
