"""The front end of `specli chat`: reads turns from a terminal (readline editing, history, multi-line
input, Ctrl-C handling) or from piped stdin (one turn per line: reply text on stdout, everything else on
stderr), and draws each reply as it streams. Everything else is the session's (:mod:`specli.chat.session`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from specli import signals
from specli.api import Speculator
from specli.chat.session import ChatError, ChatOptions, ChatSession, ContextNotice, format_turn_line
from specli.errors import EXIT_RUNTIME
from specli.events import Event, TokenEvent
from specli.llama import LlamaError
from specli.ui.console import make_console, shows_styles

EXIT_OK = 0


# -- input ----------------------------------------------------------------------------------------------

ReadLine = Callable[[str], "str | None"]  # prompt -> a line without its newline, None at end of input
BLOCK = '"""'


def read_message(read_line: ReadLine, prompt: str = "> ", continuation: str = "… ",
                 on_open_block_at_eof: Callable[[], None] | None = None) -> str | None:
    """One user message: a line; `\\` at the end continues it; a \"\"\" block spans lines. None at EOF.
    End of input inside a block sends what the block holds, after calling `on_open_block_at_eof`."""
    first = read_line(prompt)
    if first is None:
        return None
    stripped = first.strip()
    if stripped.startswith(BLOCK):
        rest = stripped[len(BLOCK):]
        if rest.endswith(BLOCK):  # """one line"""
            return rest[: -len(BLOCK)]
        parts = [rest] if rest else []
        while (line := read_line(continuation)) is not None:
            if line.rstrip().endswith(BLOCK):
                tail = line.rstrip()[: -len(BLOCK)]
                if tail:
                    parts.append(tail)
                break
            parts.append(line)
        else:
            if on_open_block_at_eof is not None:
                on_open_block_at_eof()
        return "\n".join(parts)
    parts = []
    line: str | None = first
    while line is not None and line.endswith("\\"):
        parts.append(line[:-1])
        line = read_line(continuation)
    if line is not None:
        parts.append(line)
    return "\n".join(parts)


def _stream_reader(stream: TextIO) -> ReadLine:
    def read_line(_prompt: str) -> str | None:
        line = stream.readline()
        if not line:
            return None
        return line.rstrip("\r\n")

    return read_line


def _terminal_reader() -> ReadLine:
    def read_line(prompt: str) -> str | None:
        try:
            return input(prompt)
        except EOFError:
            return None

    return read_line


def default_history_path() -> Path:
    """Where terminal input history is kept: $XDG_STATE_HOME/specli/chat_history (~/.local/state)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "specli" / "chat_history"


def _setup_readline(history: Path | None) -> Callable[[], None]:
    """Line editing for input() (if readline exists); returns a function that saves the history."""
    try:
        import readline
    except ImportError:  # Windows without pyreadline: plain input() still works
        return lambda: None
    if history is None:
        return lambda: None
    try:
        readline.read_history_file(history)
    except OSError:
        pass  # first run, or unreadable: start empty
    readline.set_history_length(1000)

    def save() -> None:
        try:
            history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history)
        except OSError:
            pass  # history is a convenience; never fail the chat over it

    return save


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# -- Ctrl-C during a reply ------------------------------------------------------------------------------


class _InterruptLatch:
    """During a reply, the first Ctrl-C only sets a flag (the loop stops between two engine events, so
    the caches stay consistent); a second one raises KeyboardInterrupt as usual."""

    def __init__(self) -> None:
        self.fired = False
        self._previous: Any = None
        self._installed = False

    def _handler(self, signum: int, frame: object) -> None:
        signals.note(signum)
        if self.fired:
            raise KeyboardInterrupt
        self.fired = True

    def __enter__(self) -> _InterruptLatch:
        # Signal handlers can only be set from the main thread; elsewhere Ctrl-C keeps its default.
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)


# -- the loop -------------------------------------------------------------------------------------------


def _ansi_prompt(text: str, colour: bool) -> str:
    # \001 .. \002 tell readline the escape codes take no room, so line editing stays aligned.
    return f"\001\033[1;32m\002{text}\001\033[0m\002" if colour else text


def run_chat(spec: Speculator, options: ChatOptions, *, input_stream: TextIO | None = None,
             console: Console | None = None, err_console: Console | None = None) -> int:
    """Chat until Ctrl-D, /exit or end of input; returns the exit code (0, 1 after a failed turn in
    piped mode, 130 after Ctrl-C twice at the prompt or once in piped mode, 143 after SIGTERM)."""
    from specli.ui.stream import TokenPrinter

    input_stream = input_stream if input_stream is not None else sys.stdin
    console = console or make_console()
    err_console = err_console or make_console(stderr=True)
    # Terminal mode needs both ends: input() reads sys.stdin, and the reply is drawn on `console`.
    interactive = input_stream is sys.stdin and _is_tty(input_stream) and console.is_terminal
    info = console if interactive else err_console  # stdout carries only replies when scripted
    session = ChatSession(spec, options)

    def say(text: str, style: str = "dim") -> None:
        info.print(Text(text, style=style), soft_wrap=True)

    def error(text: str) -> None:
        info.print(Text(text, style="red"), soft_wrap=True)

    sources = spec.drafter.sources if spec.drafter else ()
    printer = (TokenPrinter(console, show_rejected=options.show_rejected, sources=sources)
               if console.is_terminal else None)

    if interactive:
        read_line, save_history = _open_terminal(spec, options, console, say)
    else:
        read_line, save_history = _stream_reader(input_stream), lambda: None
    if session.template_notice:
        say(f"note: {session.template_notice}", "yellow")
    try:
        return _Turns(session, console, printer, say, error, interactive).run(read_line)
    finally:
        save_history()


class _Turns:
    """The loop of a chat: read a message (or a slash command), answer it, until the input ends; what
    it has met so far decides the exit code."""

    def __init__(self, session: ChatSession, console: Console, printer: Callable[[Event], None] | None,
                 say: Callable[..., None], error: Callable[[str], None], interactive: bool) -> None:
        self.session, self.console, self.printer = session, console, printer
        self.say, self.error, self.interactive = say, error, interactive
        self.exit_code = EXIT_OK
        self.open_block_at_eof = False

    def block_left_open(self) -> None:
        self.open_block_at_eof = True
        if self.interactive:
            self.console.print()
        self.error('end of input inside a """ block: sending what it holds (close a block with """)')

    def run(self, read_line: ReadLine) -> int:
        """Chat until the input ends (the exit code so far), /exit, or an interruption that ends it."""
        session, console, interactive, say = self.session, self.console, self.interactive, self.say
        colour = interactive and console.color_system is not None
        prompt, continuation = _ansi_prompt("> ", colour), _ansi_prompt("… ", colour)
        ctrl_c_at_prompt = False
        while True:
            try:
                message = read_message(read_line, prompt, continuation, self.block_left_open)
            except KeyboardInterrupt as e:
                if ctrl_c_at_prompt or not interactive or isinstance(e, signals.Terminated):
                    if interactive:
                        console.print()
                    return signals.exit_code(e)
                ctrl_c_at_prompt = True
                console.print()
                say("(Ctrl-C again or Ctrl-D to leave)")
                continue
            ctrl_c_at_prompt = False
            if message is None:
                if interactive:
                    console.print()
                return self.exit_code
            if not message.strip():
                continue
            if message.startswith("/") and not message.startswith("//"):
                result = session.command(message)
                if result.failed and not interactive:
                    self.exit_code = EXIT_RUNTIME  # a script's /save that wrote nothing must not look fine
                if result.exit:
                    return self.exit_code
                if result.error:
                    self.error(result.text)
                elif result.text:
                    say(result.text)
                continue
            if message.startswith("//"):
                message = message[1:]
            if not interactive:
                # stdout carries only the replies: stderr says which line each one answers.
                say(f"[{len(session.turns) + 1}] > {_first_line(message)}")
            outcome = _reply(session, message, console=console, printer=self.printer, say=say,
                             error=self.error, numbered=not interactive)
            if outcome == "failed" and not interactive:
                self.exit_code = EXIT_RUNTIME
            if outcome == "interrupted" and (not interactive or signals.terminated()):
                # A script (or SIGTERM) means stop: the partial reply is shown, the rest is not read,
                # and the exit code says so.
                return signals.exit_code()
            if self.open_block_at_eof and not interactive:
                self.exit_code = EXIT_RUNTIME  # the input was cut short


def _open_terminal(spec: Speculator, options: ChatOptions, console: Console,
                   say: Callable[[str], None]) -> tuple[ReadLine, Callable[[], None]]:
    """Terminal input (readline, its history unless --no-history) and the greeting: what to read lines
    with, and what saves the history at the end."""
    from specli.ui.stream import legend

    save_history = _setup_readline(default_history_path() if options.history else None)
    draft_name = spec.drafter.name if spec.drafter else "no draft"
    say(f"chatting with {spec.target.path.name} · {draft_name} · context {spec.target.n_ctx} · "
        "/help for commands, Ctrl-D to leave")
    sources = spec.drafter.sources if spec.drafter else ()
    if spec.drafter is not None and (shown := legend(options.show_rejected, sources,
                                                     styled=shows_styles(console))):
        console.print(shown)
    return _terminal_reader(), save_history


def _first_line(message: str, width: int = 72) -> str:
    """A message as one short line (a block's first line; long ones cut, with an ellipsis)."""
    lines = message.strip().splitlines() or [""]
    line = lines[0]
    cut = len(line) > width or len(lines) > 1
    return (line[: width - 1] + "…") if cut else line


def _reply(session: ChatSession, message: str, *, console: Console, printer: Callable[[Event], None] | None,
           say: Callable[..., None], error: Callable[[str], None], numbered: bool = False) -> str:
    """Generate and show one reply: "done", "failed" (the error is shown, the chat goes on) or
    "interrupted" (Ctrl-C or SIGTERM stopped it; the partial reply is kept). `numbered`: the stats line
    carries the turn's number, as the line that showed its message did (piped input)."""
    out = console.file
    latch = _InterruptLatch()
    failure: str | None = None
    interrupted = False
    # From the start: a Ctrl-C while the prompt is prepared or evaluated stops this reply, not the chat.
    with latch:
        try:
            events = session.send(message)
        except ChatError as e:
            error(str(e))
            return "failed"
        except KeyboardInterrupt:  # a second Ctrl-C, or SIGTERM, before the reply began
            return "interrupted"
        if latch.fired:
            events.close()  # not started: nothing to record
            return "interrupted"
        try:
            for event in events:
                if isinstance(event, ContextNotice):
                    say(event.message, "yellow")
                elif printer is not None:
                    printer(event)
                elif isinstance(event, TokenEvent) and event.text:
                    out.write(event.text)
                    out.flush()
                if latch.fired:
                    break
        except KeyboardInterrupt:
            interrupted = True  # a second Ctrl-C, or SIGTERM: the reply stops here all the same
        except (LlamaError, ValueError) as e:  # context full, NaN logits ...: one line, stay in the chat
            failure = str(e) or type(e).__name__
        finally:
            events.close()  # records the (partial) reply in the session
    if printer is not None:
        console.print()
    else:
        out.write("\n")
        out.flush()
    if failure is not None:
        error(f"error: {failure}")
        return "failed"
    turn = session.turns[-1] if session.turns else None
    if turn is not None:
        say(f"[{turn.index}] {format_turn_line(turn)}" if numbered else format_turn_line(turn))
    return "interrupted" if interrupted or latch.fired else "done"
