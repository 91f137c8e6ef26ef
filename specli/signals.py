"""Ctrl-C (SIGINT) and SIGTERM end a command the same way: the signal raises KeyboardInterrupt (SIGTERM:
its subclass `Terminated`) where Python runs next, so every place that stops cleanly on Ctrl-C (a
generation keeps what it released, bench keeps the pairs that finished) stops the same way when
`timeout`, systemd or a container runtime sends SIGTERM. The exit code says which: 128 + the signal.

Python runs a signal's handler only between bytecodes of the main thread: never inside llama.cpp, but
inside any Python code llama.cpp calls back, where ctypes would print and drop the exception. So no
Python code may run as a llama.cpp callback (specli.llama's log callback is C code).

No typer, no rich: the core raises and catches these; only the launcher installs the handlers.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143


class Terminated(KeyboardInterrupt):
    """SIGTERM: raised where SIGINT raises KeyboardInterrupt, and caught by the same handlers."""


_received: int | None = None  # the last signal handled, None if none
_holding = False  # after `hold()`: record signals, raise nothing (the program is already exiting)


def _handler(signum: int, frame: Any) -> None:
    global _received
    _received = signum
    if _holding:
        return
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def install() -> None:
    """Route SIGINT and SIGTERM through one handler (main thread only; a signal the parent set to be
    ignored, as a shell does for background jobs, stays ignored)."""
    global _received, _holding
    _received, _holding = None, False
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _handler)


def hold() -> None:
    """From here on a signal is only recorded: the program is exiting and prints its last line."""
    global _holding
    _holding = True


def note(signum: int) -> None:
    """Record a signal handled elsewhere (chat's own Ctrl-C latch), so the exit code says it."""
    global _received
    _received = signum


def terminated() -> bool:
    return _received == signal.SIGTERM


def exit_code(interruption: BaseException | None = None) -> int:
    """128 + the signal that interrupted the program (130 for Ctrl-C, 143 for SIGTERM)."""
    if isinstance(interruption, Terminated) or (interruption is None and terminated()):
        return EXIT_TERMINATED
    return EXIT_INTERRUPTED


def message(code: int) -> str:
    """The last line of an interrupted command."""
    return "terminated (SIGTERM)" if code == EXIT_TERMINATED else "interrupted"
