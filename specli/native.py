"""specli's host filters and keyed draw compiled for this machine (native_sampling.c; issue #51).

A filtered row in numpy takes some thirty calls, each ~1 µs on the caches a decode has just evicted:
60-100 µs a token over a 152k-262k vocabulary, 9-14 % of a 0.7 ms token. The C file does the same
arithmetic in one call. It is compiled with the machine's C compiler (`$CC`, else `cc`) on first use
and kept under the cache directory ($SPECLI_CACHE_DIR, else $XDG_CACHE_HOME/specli or ~/.cache/specli,
in native/; $SPECLI_NATIVE_DIR instead where set), named by a hash of the source and flags.
Where there is no compiler or the build fails, sampling.py uses numpy: the same supports, scores and
tokens (tests/test_native_sampling.py), slower. SPECLI_NATIVE_SAMPLING=0 keeps numpy. Nothing here
raises: `reason()` says what happened."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specli.fileio import cache_base, switched_off

SOURCE = Path(__file__).with_name("native_sampling.c")
# No fused multiply-adds and no fast-math: every operation rounds as Python's and numpy's do.
FLAGS = ("-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math")
COMPILE_SECONDS = 120

_c_long, _c_double, _c_void_p, _c_uint64 = ctypes.c_long, ctypes.c_double, ctypes.c_void_p, ctypes.c_uint64


def data_address(a) -> int:
    """Where a contiguous numpy array's data starts, for a C call: through a ctypes view of a writable
    buffer (a quarter of the cost of a.ctypes.data), else the array interface."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.__array_interface__["data"][0]


class FilterSettings(ctypes.Structure):
    """native_sampling.c's filter_settings: what one sampling setting asks of every row."""

    _fields_ = [("top_k", ctypes.c_int64), ("top_p", _c_double), ("min_p", _c_double),
                ("inv_t", _c_double), ("n_banned", ctypes.c_int64), ("banned", _c_void_p)]


@dataclass(frozen=True)
class NativeSampling:
    """The compiled functions (their C comments say what each does) and where the library lives.
    `filter` None: its passes over the row are not vectorized on this processor (not x86-64), and
    numpy's are faster."""

    filter: ctypes._CFuncPtr | None
    filter_draw: ctypes._CFuncPtr | None  # with `filter`
    keyed_argmax: ctypes._CFuncPtr
    keyed_gumbel: ctypes._CFuncPtr
    dense_scores: ctypes._CFuncPtr
    dense_draw: ctypes._CFuncPtr
    path: Path


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def _library_name(source: bytes) -> str:
    key = hashlib.sha256()
    for part in (source, " ".join(FLAGS).encode(), platform.machine().encode(), sys.platform.encode()):
        key.update(part)
        key.update(b"\0")
    suffix = ".dylib" if sys.platform == "darwin" else ".so"
    return f"specli-sampling-{key.hexdigest()[:16]}{suffix}"


class CompilerFailed(Exception):
    """The compiler is missing, failed or took too long: another directory would not help."""


def _compile(source_path: Path, target: Path, compiler: list[str]) -> None:
    """Build into a temporary file beside `target`, then rename: a concurrent process never loads half
    a library."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        try:
            done = subprocess.run([*compiler, *FLAGS, "-o", tmp, str(source_path), "-lm"],
                                  capture_output=True, text=True, timeout=COMPILE_SECONDS,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise CompilerFailed(f"no C compiler ({compiler[0]} not found; $CC names one)") from None
        except (OSError, subprocess.SubprocessError) as e:
            raise CompilerFailed(f"{compiler[0]}: {e}") from None
        if done.returncode != 0:
            first = (done.stderr or done.stdout).strip().splitlines()[:1]
            raise CompilerFailed(f"{compiler[0]} failed: {first[0] if first else f'exit {done.returncode}'}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _forget_others(kept: Path) -> None:
    """Remove the builds of earlier versions of the C file beside `kept` (a process still running one
    keeps its mapping)."""
    for other in kept.parent.glob("specli-sampling-*"):
        if other != kept and not other.name.startswith("."):
            try:
                other.unlink()
            except OSError:
                pass


def _bind(path: Path) -> NativeSampling:
    lib = ctypes.CDLL(str(path))
    f = lib.specli_filter
    f.argtypes = [_c_void_p, _c_long, _c_void_p, _c_void_p]
    f.restype = _c_long
    fd = lib.specli_filter_draw
    fd.argtypes = [_c_void_p, _c_long, _c_void_p, _c_void_p, _c_uint64, _c_uint64, _c_uint64, _c_uint64]
    fd.restype = _c_long
    argmax = lib.specli_keyed_argmax
    argmax.argtypes = [_c_void_p, _c_void_p, _c_long, _c_uint64, _c_uint64, _c_uint64, _c_uint64]
    argmax.restype = _c_long
    gumbel = lib.specli_keyed_gumbel
    gumbel.argtypes = [_c_void_p, _c_long, _c_uint64, _c_void_p]
    gumbel.restype = None
    scores = lib.specli_dense_scores
    scores.argtypes = [_c_void_p, _c_long, ctypes.c_float, _c_void_p, _c_void_p]
    scores.restype = _c_double
    draw = lib.specli_dense_draw
    draw.argtypes = [_c_void_p, _c_long, _c_void_p, _c_uint64, _c_uint64, _c_uint64, _c_uint64]
    draw.restype = _c_long
    lib.specli_filter_vectorized.restype = ctypes.c_int
    vectorized = lib.specli_filter_vectorized()
    return NativeSampling(f if vectorized else None, fd if vectorized else None, argmax, gumbel, scores, draw,
                          path)


def _directories() -> list[Path]:
    """Where the library may live: $SPECLI_NATIVE_DIR alone where set, else the cache directory, then
    a directory of this user's own under the system's temporary one."""
    chosen = os.environ.get("SPECLI_NATIVE_DIR")
    if chosen:
        return [Path(chosen)]
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return [cache_base() / "native", Path(tempfile.gettempdir()) / f"specli-native-{user}"]


def _check_private(directory: Path) -> None:
    """Create `directory` for this user alone, and refuse one that another user owns or can write: a
    library loaded from it runs in this process."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not hasattr(os, "getuid"):
        return
    st = directory.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(f"{directory} is not this user's own (owner {st.st_uid}, mode {st.st_mode & 0o777:o})")


_reason = "not loaded yet"


@functools.cache
def native() -> NativeSampling | None:
    """The compiled functions, built on first use, or None (then `reason()` says why)."""
    global _reason
    if switched_off("SPECLI_NATIVE_SAMPLING"):
        _reason = "numpy (SPECLI_NATIVE_SAMPLING=0)"
        return None
    try:
        source = SOURCE.read_bytes()
    except OSError as e:
        _reason = f"numpy (cannot read {SOURCE.name}: {e.strerror or e})"
        return None
    compiler = _compiler()
    name = _library_name(source)
    problem = ""
    for directory in _directories():
        path = directory / name
        try:
            _check_private(directory)
            if not path.is_file():
                _compile(SOURCE, path, compiler)
                _forget_others(path)
            try:
                bound = _bind(path)
            except (OSError, AttributeError):  # a damaged file (a full disk, a killed build): again
                _compile(SOURCE, path, compiler)
                bound = _bind(path)
        except CompilerFailed as e:
            problem = str(e)
            break
        except (OSError, AttributeError) as e:  # this directory: the next may do
            problem = str(e) or type(e).__name__
            continue
        _reason = f"native ({path})"
        return bound
    _reason = f"numpy (no C build: {problem})"
    return None


def reason() -> str:
    """How host rows are filtered in this process, and why: "native (PATH)" or "numpy (why)"."""
    native()
    return _reason
