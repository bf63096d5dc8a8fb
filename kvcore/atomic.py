"""Atomic file writes: a temp file in the destination folder, fsync, then os.replace.

A crash or a full disk mid-write must never leave a half-written CSV, settings, image or cache file where a
good one was; os.replace within one folder is atomic on POSIX and Windows. The temp file keeps the target's
suffix so writers that choose a format by suffix (image exporters, safetensors) still work.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it replaces `path`, on failure it is removed."""
    dest = Path(path)
    folder = dest.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: folder does not exist; choose an existing folder")
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.stem}.", suffix=f".tmp{dest.suffix}", dir=folder)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()


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
