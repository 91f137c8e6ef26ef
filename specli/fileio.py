"""Files in and out: open only regular files for reading, check output paths before the work, and
write results atomically (a reader never sees half a file, a failed write never leaves one) where the
user pointed: through symbolic links, and directly into pipes, devices and our own stdout."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import TextIO


class FileProblem(OSError):
    """A path that cannot be used as asked; str() is a one-line message for the user."""


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def regular_file_problem(path: str | os.PathLike[str]) -> str | None:
    """None if `path` is an existing regular file (symlinks followed), else why not. Only stat()s:
    opening a FIFO for reading would block until a writer appears, i.e. forever."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "broken symbolic link" if os.path.lexists(path) else "no such file"
    except PermissionError:
        return "cannot read the file (permission denied)"
    except OSError as e:
        return f"cannot read the file ({e.strerror or e})"
    if not stat.S_ISREG(st.st_mode):
        return f"is {file_kind(st.st_mode)}, not a regular file"
    return None


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _stream_of(path: str | os.PathLike[str]) -> TextIO | None:
    """sys.stdout or sys.stderr if `path` names the file this process writes them to (/dev/stdout,
    /dev/fd/2, /proc/self/fd/1, or the very file stdout was redirected to), else None."""
    try:
        named = _identity(os.stat(path))
    except (OSError, ValueError):
        return None
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and _identity(os.fstat(stream.fileno())) == named:
                return stream
        except (OSError, ValueError, AttributeError):  # closed, or not a real file
            continue
    return None


def output_target(path: str | os.PathLike[str]) -> Path:
    """Where a write to `path` lands: symbolic links followed (to a file that may not exist yet), so a
    link is written through, never replaced by a regular file."""
    return Path(os.path.realpath(Path(path).expanduser()))


def same_output(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether writing to `a` and to `b` writes one file (links, /dev/stdout and the file stdout goes to
    included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return output_target(a) == output_target(b)


def check_output_path(path: str | os.PathLike[str], option: str) -> Path:
    """Refuse an output path that cannot be written, before any work is done. Returns the path."""
    if not os.fspath(path).strip():
        raise FileProblem(f"{option} was given an empty file name")
    p = Path(path).expanduser()
    if _stream_of(p) is not None:
        return p  # our own stdout or stderr: written through the stream
    real = output_target(p)
    if real.is_dir():
        raise FileProblem(f"{option} {p}: is a directory; give a file name")
    parent = real.parent
    shown = f"{p} (a link to {real})" if real != p.absolute() and os.path.islink(p) else str(p)
    if not parent.exists():
        raise FileProblem(f"{option} {shown}: the directory {parent} does not exist")
    if not parent.is_dir():
        raise FileProblem(f"{option} {shown}: {parent} is not a directory")
    if real.exists():
        if not os.access(real, os.W_OK):
            raise FileProblem(f"{option} {shown}: the file is not writable (permission denied)")
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise FileProblem(f"{option} {shown}: cannot create files in {parent} (permission denied)")
    return p


def switched_off(variable: str) -> bool:
    """Whether the environment variable turns something off (0, off, no, false; any case)."""
    return os.environ.get(variable, "").strip().lower() in ("0", "off", "no", "false")


def cache_base() -> Path:
    """specli's cache directory: $SPECLI_CACHE_DIR, else $XDG_CACHE_HOME/specli or ~/.cache/specli."""
    base = os.environ.get("SPECLI_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "specli"
    )
    return Path(base)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` where `path` points, so the named file is either the old one or the complete new one.

    Written directly, never by rename, where a rename would replace something other than the file:
    our own stdout or stderr (/dev/stdout, or the file stdout was redirected to: through the stream,
    after what was printed), a pipe or a device, a file with other hard links, a file whose directory
    we cannot write. A symbolic link is followed: the file it points to is replaced, the link stays."""
    stream = _stream_of(Path(path).expanduser())
    if stream is not None:
        stream.flush()
        stream.write(text)
        stream.flush()
        return
    real = output_target(path)
    try:
        st: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        st = None
    in_place = st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink > 1
                                   or not os.access(real.parent, os.W_OK | os.X_OK))
    if in_place:
        with open(real, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            # keep the permissions an existing file had (mkstemp creates 0600)
            os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        except OSError:
            pass
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
