"""Files in and out: open only regular files for reading, check output paths before the work, and
write results atomically (a reader never sees half a file, a failed write never leaves one)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


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


def check_output_path(path: str | os.PathLike[str], option: str) -> Path:
    """Refuse an output path that cannot be written, before any work is done. Returns the path."""
    p = Path(path).expanduser()
    if p.exists() and p.is_dir():
        raise FileProblem(f"{option} {p}: is a directory; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise FileProblem(f"{option} {p}: the directory {parent} does not exist")
    if not parent.is_dir():
        raise FileProblem(f"{option} {p}: {parent} is not a directory")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise FileProblem(f"{option} {p}: the file is not writable (permission denied)")
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise FileProblem(f"{option} {p}: cannot create files in {parent} (permission denied)")
    return p


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` through a temporary file in the same directory and a rename, so the
    file is either the old one or the complete new one. Non-regular targets (/dev/stdout, a pipe)
    are written directly: they cannot be replaced."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_file():
        with open(p, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            # keep the permissions an existing file had (mkstemp creates 0600)
            os.chmod(tmp, stat.S_IMODE(os.stat(p).st_mode) if p.exists() else 0o666 & ~_umask())
        except OSError:
            pass
        os.replace(tmp, p)
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
