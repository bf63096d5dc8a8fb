"""Atomic file writes: a temp file in the destination folder, then os.replace.

A crash or a full disk mid-write must never leave a half-written CSV, settings or cache file where a good one
was; os.replace within one folder is atomic on POSIX and Windows.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it replaces `path`, on failure it is removed."""
    dest = Path(path)
    folder = dest.parent if str(dest.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: folder does not exist; choose an existing folder")
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=suffix or ".tmp", dir=folder)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 text atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_with(path: str | os.PathLike, writer: Callable[[Path], None], suffix: str = "") -> None:
    """Call writer(temp_path) and move the result into place atomically."""
    with atomic_path(path, suffix=suffix) as tmp:
        writer(tmp)
