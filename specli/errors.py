"""The command line's way of failing: one clear line and an exit code (2: usage, 1: runtime, 130:
interrupted). UsageProblem (specli.settings) is the core's "the user asked for something that cannot
work"; only here does it become exit 2."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from specli import signals
from specli.settings import UsageProblem
from specli.text import printable

EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = signals.EXIT_INTERRUPTED  # 130; SIGTERM: 143 (specli.signals)

__all__ = ["EXIT_INTERRUPTED", "EXIT_RUNTIME", "EXIT_USAGE", "UsageProblem", "debug_enabled", "fail",
           "friendly_errors"]


def debug_enabled() -> bool:
    """Whether tracebacks are shown (`specli --debug`, which sets SPECLI_DEBUG=1): SPECLI_DEBUG set to
    anything but "" or "0". The one reading of the variable (the CLI's errors, serve's log lines)."""
    return os.environ.get("SPECLI_DEBUG", "") not in ("", "0")


def fail(message: str, code: int = EXIT_RUNTIME) -> typer.Exit:
    try:
        sys.stdout.flush()  # what was printed comes before the error
    except (OSError, ValueError, AttributeError):
        pass
    # One line, on stderr, prefixed so it stands apart from generated text.
    # printable(): a path, a file's text or a model's may hold a newline or escape codes
    print(f"specli: error: {printable(message)}", file=sys.stderr, flush=True)
    return typer.Exit(code)


@contextmanager
def friendly_errors() -> Iterator[None]:
    """Known failures become `specli: error: ...` and an exit code; tracebacks only with --debug."""
    # Imported here, not with the module: loading the CLI (--help) does not load them.
    from specli.compat import VocabMismatchError
    from specli.config import ConfigError
    from specli.gguf_info import GGUFError
    from specli.llama import LlamaError
    from specli.sampling import SamplingError

    known = (VocabMismatchError, LlamaError, SamplingError, OSError, GGUFError, ConfigError)
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except KeyboardInterrupt as e:
        # Outside a generation (loading, prompt setup): nothing to report but the interruption, which
        # the launcher says last (specli.cli.main).
        raise typer.Exit(signals.exit_code(e)) from None
    except BrokenPipeError:
        # The reader went away (`specli run ... | head -1`): end quietly. Point stdout at devnull so
        # the interpreter's final flush does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise typer.Exit(0) from None
    except UsageProblem as e:
        if debug_enabled():
            raise
        raise fail(str(e), EXIT_USAGE) from None
    except known as e:
        if debug_enabled():
            raise
        raise fail(str(e) or type(e).__name__) from None
    except ValueError as e:
        if debug_enabled():
            raise
        raise fail(str(e)) from None
    except Exception as e:  # an unexpected failure: still one line, with a hint
        if debug_enabled():
            raise
        raise fail(f"{type(e).__name__}: {e} (run with --debug for the traceback)") from None
