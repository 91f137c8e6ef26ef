"""llama.cpp's log, and its backend's start, which installs it: once per process.

llama.cpp's log callback is C code, never Python: Python runs a signal's handler between any two
bytecodes of the main thread, so a Ctrl-C landing in a Python callback (llama.cpp logs hundreds of
lines while loading) raised KeyboardInterrupt inside it, where ctypes printed "Exception ignored" and
dropped it: the load went on and the run finished with exit 0. With C callbacks the signal waits until
the llama.cpp call returns, then interrupts Python code that can stop cleanly.
"""

from __future__ import annotations

import ctypes

import llama_cpp as llc

# Quiet: a C function that ignores its arguments and touches nothing (Py_IsInitialized only reads a
# flag, needs no GIL, and every C calling convention lets a callee ignore arguments it does not take).
# Verbose: NULL, llama.cpp's own logger, which writes to stderr.
_QUIET_LOG = ctypes.cast(ctypes.pythonapi.Py_IsInitialized, llc.llama_log_callback)
_LLAMA_CPP_LOG = llc.llama_log_callback()  # a NULL function pointer
_backend_ready = False
_log_verbose = False


def set_verbose(verbose: bool) -> None:
    """Show llama.cpp's own log on stderr (True) or silence it (False, the default)."""
    global _log_verbose
    _log_verbose = verbose
    llc.llama_log_set(_LLAMA_CPP_LOG if verbose else _QUIET_LOG, ctypes.c_void_p(0))


def ensure_backend() -> None:
    """Start llama.cpp's backend (once per process), its log set first: before any model is loaded."""
    global _backend_ready
    if not _backend_ready:
        set_verbose(_log_verbose)
        llc.llama_backend_init()
        _backend_ready = True
