"""The console script's entry point. It imports nothing heavy: the signal handlers go in first, so a
Ctrl-C or SIGTERM during the half second it takes to import numpy, llama.cpp, typer and rich ends the
program with one line and its exit code (130, 143), not a traceback from the middle of an import."""

from __future__ import annotations

import os
import sys

from specli import signals


def main() -> None:
    signals.install()
    if sys.stderr is None:  # started with stderr closed (2>&-): print() would fall back to stdout
        sys.stderr = open(os.devnull, "w")  # for the life of the process
    try:
        from specli.cli import main as cli_main
    except KeyboardInterrupt as interruption:
        signals.hold()
        code = signals.exit_code(interruption)
        try:
            print(f"specli: {signals.message(code)}", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # no stderr to say it on
            pass
        sys.exit(code)
    cli_main()


if __name__ == "__main__":
    main()
