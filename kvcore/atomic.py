"""Atomic file writes: a temp file in the destination folder, fsync, then os.replace.

A crash or a full disk mid-write must never leave a half-written CSV, settings, image or cache file where a
good one was; os.replace within one folder is atomic on POSIX and Windows. The temp file keeps the target's
suffix so writers that choose a format by suffix (image exporters, safetensors) still work. The new file keeps
the permission bits of the one it replaces (a new file gets the umask's, as open() would give it), and the temp
files an earlier, killed write of the same file left behind are removed when the next write of it starts (a write
in progress holds a lock on its temp file, so a concurrent one is left alone).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

#: mkstemp's random part: eight of [a-z0-9_].
_RANDOM = r"[a-z0-9_]{8}"


class MissingFolder(FileNotFoundError):
    """The destination's folder does not exist (ENOENT, `filename` the folder), said in one plain line."""

    def __init__(self, folder: Path) -> None:
        super().__init__(errno.ENOENT, "folder does not exist; choose an existing folder", str(folder))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def temp_prefix_suffix(dest: Path) -> tuple[str, str]:
    """The (prefix, suffix) of the temp files written for `dest`: `.<stem>.XXXXXXXX.tmp<suffix>`."""
    return f".{dest.stem}.", f".tmp{dest.suffix}"


def stale_temp_files(dest: Path) -> list[Path]:
    """Temp files beside `dest` that a write of `dest` (this module's name pattern) left behind."""
    prefix, suffix = temp_prefix_suffix(dest)
    pattern = re.compile(re.escape(prefix) + _RANDOM + re.escape(suffix))
    try:
        names = os.listdir(dest.parent)
    except OSError:
        return []
    return [dest.parent / n for n in names if pattern.fullmatch(n)]


def _umask() -> int:
    """The process umask (read without changing it where /proc has it; os.umask's set-and-restore otherwise)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(dest: Path) -> int:
    """The permission bits `dest` keeps (an existing file's), or a new file's under the umask."""
    try:
        return dest.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it replaces `path`, on failure it is removed.

    An OSError (a full disk, the folder gone, a folder in the file's place) names `path`."""
    dest = Path(path)
    folder = dest.parent
    if not folder.is_dir():
        raise MissingFolder(folder)
    for stale in stale_temp_files(dest):
        _remove_unless_locked(stale)
    prefix, suffix = temp_prefix_suffix(dest)
    try:
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(dest)) from None
    _lock(fd)  # held until the temp file is gone: another write of `dest` running now leaves it alone
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, _mode_for(dest))
        os.replace(tmp_path, dest)
    except OSError as exc:
        if exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(dest)) from None  # the subclass that errno names
    finally:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        os.close(fd)


def _lock(fd: int, wait: bool = True) -> bool:
    """An exclusive advisory lock on `fd` (released when the process dies); False if another holds it."""
    try:
        import fcntl
    except ImportError:  # no advisory locks (Windows): a live temp file is told from a stale one by nothing
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        return False
    return True


def _remove_unless_locked(stale: Path) -> None:
    """Remove a temp file that no live write holds (a killed write's locks went with its process)."""
    try:
        fd = os.open(stale, os.O_RDONLY)
    except OSError:
        return
    try:
        if _lock(fd, wait=False):
            with contextlib.suppress(OSError):
                stale.unlink()
    finally:
        os.close(fd)


def write_stream(path: str | os.PathLike, writer: Callable[[BinaryIO], object]) -> None:
    """Call writer(binary file) on a temp file, fsync it, then move it into place: a crash leaves the old or the
    new file. A file object, not a path, so writers that add their own suffix (mx.save_safetensors) cannot."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        writer(fh)
        fh.flush()
        os.fsync(fh.fileno())


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write bytes atomically (fsynced before the rename)."""
    write_stream(path, lambda fh: fh.write(data))


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 text atomically."""
    write_bytes(path, text.encode("utf-8"))
