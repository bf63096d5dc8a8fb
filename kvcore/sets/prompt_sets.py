"""Prompt sets for `kvlens sweep --prompts` and `kvlens probe --prompts`: a folder of text files or a JSONL file.

A folder gives every `.txt` / `.md` / `.py` file in it (not recursive), sorted by name, the file name as the id.
A `.jsonl` file gives one `{"id": …, "prompt": …, "answer": …}` object per line (`answer` optional; it turns on
recall scoring as for the needle probes), or `{"id": …, "context": …, "questions": [{"question": …, "answer": …}]}`:
one item per question (id `doc1#1`, …) asked of the context (query-agnostic: kvcore.sets.modes); blank lines are
skipped. Every problem is one line naming file:line and
the fix, before any model is loaded, so a typo on line 4,000 does not cost the 3,999 prompts before it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: File types a prompt folder contributes.
PROMPT_SUFFIXES: tuple[str, ...] = (".txt", ".md", ".py")
#: A prompt (a file, or one JSONL prompt) larger than this is refused unread: 8 MiB is about two million tokens,
#: twice the longest context (1M tokens) of the models KV Lens runs.
MAX_PROMPT_BYTES = 8 * 1024 * 1024
#: A JSONL prompt set (or a folder's prompt files together) larger than this is refused.
MAX_SET_BYTES = 256 * 1024 * 1024


class PromptSetError(ValueError):
    """A prompt set that cannot be read, with where and how to fix it."""


@dataclass(frozen=True)
class PromptItem:
    """One prompt of a set: its id (file name or JSONL id), text and the answer that counts as recall."""

    id: str
    text: str
    answer: str | None = None
    #: The question asked of `text` (a context/questions line: one item per question, id `doc1#2`), else None.
    question: str | None = None


def load_prompts(path: Path) -> list[PromptItem]:
    """The prompts of a folder or a `.jsonl` file, in a fixed order (file names sorted; JSONL line order)."""
    if not path.exists():
        raise PromptSetError(f"--prompts {path} does not exist")
    if path.is_dir():
        items = _from_folder(path)
    elif path.suffix.lower() == ".jsonl":
        items = _from_jsonl(path)
    else:
        raise PromptSetError(
            f"--prompts {path}: give a folder of .txt/.md/.py files or a .jsonl file (one object per line)"
        )
    if not items:
        what = f"no {'/'.join(PROMPT_SUFFIXES)} files" if path.is_dir() else "no prompts"
        raise PromptSetError(f"--prompts {path}: {what}; add at least one prompt")
    return items


def read_capped(path: Path, what: str, cap: int) -> bytes:
    """The bytes of a regular file of at most `cap` bytes; PromptSetError naming `what` and `path` for a missing
    file, a folder, a FIFO or device (which would block or never end), a larger file, or a read error."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise PromptSetError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise PromptSetError(f"{what} {path} is a folder; give a text file") from None
    except OSError as exc:
        raise PromptSetError(f"{what} {path} cannot be read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise PromptSetError(f"{what} {path} is a folder; give a text file")
        if not stat.S_ISREG(info.st_mode):
            raise PromptSetError(
                f"{what} {path} is not a regular file (a pipe or a device); save the text to a file and give that"
            )
        if info.st_size > cap:
            raise PromptSetError(
                f"{what} {path} is {info.st_size:,} bytes, over the {cap:,}-byte limit (more text than a model's "
                "context holds); shorten it"
            )
        chunks, size = [], 0
        while size <= cap and (chunk := os.read(fd, min(1 << 20, cap + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise PromptSetError(f"{what} {path} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if size > cap:
        raise PromptSetError(f"{what} {path} grew past the {cap:,}-byte limit while read; shorten it")
    return b"".join(chunks)


def set_digest(items: list[PromptItem]) -> str:
    """A hash of the whole set (ids, texts, answers): ranks compare it to be sure they read the same prompts."""
    rows = [[p.id, p.text, p.answer, *([] if p.question is None else [p.question])] for p in items]
    payload = json.dumps(rows, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(payload).hexdigest()


def _from_folder(folder: Path) -> list[PromptItem]:
    files = [
        f
        for f in sorted(folder.iterdir(), key=lambda p: p.name)
        if f.is_file() and f.suffix.lower() in PROMPT_SUFFIXES
    ]
    total = sum(f.stat().st_size for f in files)
    if total > MAX_SET_BYTES:
        raise PromptSetError(
            f"--prompts {folder}: its prompt files hold {total:,} bytes, over the {MAX_SET_BYTES:,}-byte limit "
            "of a set; split the folder into smaller sets"
        )
    items = []
    for f in files:
        try:
            text = read_capped(f, "prompt file", MAX_PROMPT_BYTES).decode("utf-8")
        except UnicodeDecodeError:
            raise PromptSetError(
                f"{f}: not UTF-8 text; save it as UTF-8 or move it out of {folder}"
            ) from None
        if not text.strip():
            raise PromptSetError(f"{f}: empty; write a prompt into it or move it out of {folder}")
        items.append(PromptItem(f.name, text))
    return items


def _from_jsonl(path: Path) -> list[PromptItem]:
    try:
        lines = read_capped(path, "--prompts", MAX_SET_BYTES).decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise PromptSetError(f"{path}: not UTF-8 text; save it as UTF-8") from None
    items: list[PromptItem] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        for item in _parse_line(line, f"{path}:{n}"):
            if item.id in seen:
                raise PromptSetError(
                    f"{path}:{n}: id {item.id!r} is already used on line {seen[item.id]}; give every prompt its "
                    "own id"
                )
            seen[item.id] = n
            items.append(item)
    return items


def _parse_line(line: str, where: str) -> list[PromptItem]:
    """One prompt, or a context/questions line's one item per question (id `doc1#1`, `doc1#2`, …)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        obj = None  # json_record names the problem
    if isinstance(obj, dict) and "context" in obj and "prompt" not in obj:
        return _context_line(line, where)
    return [_prompt_line(line, where)]


def _item_id(obj: dict[str, Any], where: str, example: str) -> str:
    pid = obj["id"]
    if isinstance(pid, int) and not isinstance(pid, bool):
        pid = str(pid)
    if not isinstance(pid, str) or not pid.strip():
        raise PromptSetError(f"{where}: 'id' must be a non-empty string or an integer; {example}")
    _check_text(pid, "id", where, example)
    return pid


def _context_line(line: str, where: str) -> list[PromptItem]:
    example = 'write {"id": "doc1", "context": "…", "questions": [{"question": "…", "answer": "…"}]}'
    obj = json_record(line, where, example, ("id", "context", "questions"), ("id", "context", "questions"))
    pid = _item_id(obj, where, example)
    context = text_field(obj, "context", where, example)
    if len(context.encode("utf-8")) > MAX_PROMPT_BYTES:
        raise PromptSetError(f"{where}: the context is over the {MAX_PROMPT_BYTES:,}-byte limit; shorten it")
    questions = obj["questions"]
    if not isinstance(questions, list) or not questions:
        raise PromptSetError(f"{where}: 'questions' must be a non-empty list; {example}")
    items = []
    for k, q in enumerate(questions, start=1):
        at = f"{where}: question {k}"
        if not isinstance(q, dict) or set(q) - {"question", "answer"} or "question" not in q:
            raise PromptSetError(f'{at} is not {{"question": …, "answer": …}}; {example}')
        text = text_field(q, "question", at, example)
        items.append(PromptItem(f"{pid}#{k}", context, text_field(q, "answer", at, example, False), text))
    return items


def _prompt_line(line: str, where: str) -> PromptItem:
    example = 'write {"id": "doc1", "prompt": "…", "answer": "…"} (answer optional)'
    obj = json_record(line, where, example, ("id", "prompt", "answer"), ("id", "prompt"))
    pid = _item_id(obj, where, example)
    prompt = text_field(obj, "prompt", where, example)
    answer = text_field(obj, "answer", where, example, required=False)
    if len(prompt.encode("utf-8")) > MAX_PROMPT_BYTES:
        raise PromptSetError(
            f"{where}: the prompt is over the {MAX_PROMPT_BYTES:,}-byte limit (more text than a model's "
            "context holds); shorten it"
        )
    return PromptItem(pid, prompt, answer)


def json_record(
    line: str, where: str, example: str, keys: Sequence[str], required: Sequence[str]
) -> dict[str, Any]:
    """One JSONL line as a flat object with only `keys` and every `required` key; PromptSetError naming `where`."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptSetError(f"{where}: not JSON ({exc.msg} at column {exc.colno}); {example}") from None
    except RecursionError:
        raise PromptSetError(
            f"{where}: JSON nested too deeply to read; a line is one flat object, {example}"
        ) from None
    if not isinstance(obj, dict):
        raise PromptSetError(f"{where}: a JSON {type(obj).__name__}, not an object; {example}")
    unknown = sorted(set(obj) - set(keys))
    if unknown:
        raise PromptSetError(f"{where}: unknown key {', '.join(map(repr, unknown))}; {example}")
    for key in required:
        if key not in obj:
            raise PromptSetError(f"{where}: no {key!r}; {example}")
    return obj


def text_field(obj: dict[str, Any], key: str, where: str, example: str, required: bool = True) -> str | None:
    """obj[key] as non-empty text (None when it is left out and not `required`)."""
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not (value.strip() if required else value):
        also = "" if required else " or left out"
        raise PromptSetError(f"{where}: {key!r} must be non-empty text{also}; {example}")
    _check_text(value, key, where, example)
    return value


def _check_text(value: str, key: str, where: str, example: str) -> None:
    if not _is_text(value):
        raise PromptSetError(
            f"{where}: {key!r} holds a lone surrogate escape (\\ud800-\\udfff), which is not text; "
            "write the character itself or a full surrogate pair"
        )


def _is_text(value: str) -> bool:
    """Whether `value` encodes as UTF-8 (JSON's \\ud800 escapes decode to lone surrogates, which do not)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
