"""One command's files: no output may be one of its inputs or another of its outputs.

`kvlens compress --prompt-file in.txt --csv in.txt` would replace the prompt with statistics, and
`--csv X --positions X` one output with the other. Paths are compared resolved (symlinks, `..`) and, where both
exist, by device and inode (hard links, bind mounts), before any work is done.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

from kvcore.sets.prompt_sets import PROMPT_SUFFIXES
from kvcore.sets.summary import summary_paths


def inputs(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(flag, path) of every file the command reads: prompt file, session, prompt set (each of a folder's
    prompt files), the model folder's files, and standard input when it is a file."""
    found: list[tuple[str, Path]] = []
    for flag, dest in (
        ("--prompt-file", "prompt_file"),
        ("--session", "session"),
        ("--prompts", "prompts"),
        ("--questions", "questions"),
    ):
        path = getattr(args, dest, None)
        if path is None:
            continue
        found.append((flag, Path(path)))
        if dest == "prompts" and Path(path).is_dir():
            found += [(flag, f) for f in _files(Path(path)) if f.suffix.lower() in PROMPT_SUFFIXES]
    model = Path(getattr(args, "model", "") or "")
    if str(model) and model.is_dir():
        found += [("--model", f) for f in _files(model)]
    if getattr(args, "prompt", None) == "-":
        stdin = _stdin_path()
        if stdin is not None:
            found.append(("--prompt - (standard input)", stdin))
    return found


def outputs(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(flag, path) of every file the command writes, a prompt set's summaries beside its --csv included."""
    found: list[tuple[str, Path]] = []
    for flag, dest in (
        ("--csv", "csv"),
        ("--positions", "positions"),
        ("--plot", "plot"),
        ("--out", "out"),
        ("--timeline", "timeline"),
    ):
        path = getattr(args, dest, None)
        if path is not None:
            found.append((flag, Path(path)))
    if getattr(args, "prompts", None) is not None and getattr(args, "csv", None) is not None:
        summary_csv, summary_json = summary_paths(Path(args.csv))
        found += [("--csv (its summary)", summary_csv), ("--csv (its summary)", summary_json)]
    return found


def clash(args: argparse.Namespace) -> str | None:
    """The first output that is an input or another output of the same command, as a message; None if none."""
    outs = outputs(args)
    for i, (flag, path) in enumerate(outs):
        for other_flag, other in inputs(args):
            if same_file(path, other):
                return (
                    f"{flag} {path} is the {other_flag} input {other}: writing it would replace what the "
                    f"command reads; give {flag} another file name"
                )
        for other_flag, other in outs[:i]:
            if same_file(path, other):
                return (
                    f"{flag} {path} and {other_flag} {other} are the same file: one would overwrite the other; "
                    "give each output its own file name"
                )
    return None


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: equal once resolved, or (both existing) one device and inode."""
    try:
        if a.resolve() == b.resolve():
            return True
    except (OSError, RuntimeError):
        pass
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _files(folder: Path) -> Iterable[Path]:
    try:
        return [f for f in folder.iterdir() if f.is_file()]
    except OSError:
        return []


def _stdin_path() -> Path | None:
    """Standard input's file when it is a regular file (`< in.txt`), as /proc/self/fd/0 names it."""
    try:
        fd = sys.stdin.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
    except (OSError, ValueError, AttributeError):
        return None
    link = Path(f"/proc/self/fd/{fd}")
    return link if link.exists() else None
