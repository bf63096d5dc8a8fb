"""Prompt sets for `kvlens sweep --prompts` and `kvlens probe --prompts`: a folder of text files or a JSONL file.

A folder gives every `.txt` / `.md` / `.py` file in it (not recursive), sorted by name, the file name as the id.
A `.jsonl` file gives one `{"id": …, "prompt": …, "answer": …}` object per line (`answer` optional; it turns on
recall scoring as for the needle probes); blank lines are skipped. Every problem is one line naming file:line and
the fix, before any model is loaded, so a typo on line 4,000 does not cost the 3,999 prompts before it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

#: File types a prompt folder contributes.
PROMPT_SUFFIXES: tuple[str, ...] = (".txt", ".md", ".py")


class PromptSetError(ValueError):
    """A prompt set that cannot be read, with where and how to fix it."""


@dataclass(frozen=True)
class PromptItem:
    """One prompt of a set: its id (file name or JSONL id), text and the answer that counts as recall."""

    id: str
    text: str
    answer: str | None = None


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


def set_digest(items: list[PromptItem]) -> str:
    """A hash of the whole set (ids, texts, answers): ranks compare it to be sure they read the same prompts."""
    payload = json.dumps([[p.id, p.text, p.answer] for p in items], ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(payload).hexdigest()


def _from_folder(folder: Path) -> list[PromptItem]:
    items = []
    for f in sorted(folder.iterdir(), key=lambda p: p.name):
        if not f.is_file() or f.suffix.lower() not in PROMPT_SUFFIXES:
            continue
        try:
            text = f.read_text(encoding="utf-8")
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
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise PromptSetError(f"{path}: not UTF-8 text; save it as UTF-8") from None
    items: list[PromptItem] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        item = _parse_line(line, f"{path}:{n}")
        if item.id in seen:
            raise PromptSetError(
                f"{path}:{n}: id {item.id!r} is already used on line {seen[item.id]}; give every prompt its own id"
            )
        seen[item.id] = n
        items.append(item)
    return items


def _parse_line(line: str, where: str) -> PromptItem:
    example = 'write {"id": "doc1", "prompt": "…", "answer": "…"} (answer optional)'
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptSetError(f"{where}: not JSON ({exc.msg} at column {exc.colno}); {example}") from None
    if not isinstance(obj, dict):
        raise PromptSetError(f"{where}: a JSON {type(obj).__name__}, not an object; {example}")
    unknown = sorted(set(obj) - {"id", "prompt", "answer"})
    if unknown:
        raise PromptSetError(f"{where}: unknown key {', '.join(map(repr, unknown))}; {example}")
    for key in ("id", "prompt"):
        if key not in obj:
            raise PromptSetError(f"{where}: no {key!r}; {example}")
    pid, prompt, answer = obj["id"], obj["prompt"], obj.get("answer")
    if isinstance(pid, int) and not isinstance(pid, bool):
        pid = str(pid)
    if not isinstance(pid, str) or not pid.strip():
        raise PromptSetError(f"{where}: 'id' must be a non-empty string or an integer; {example}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptSetError(f"{where}: 'prompt' must be non-empty text; {example}")
    if answer is not None and (not isinstance(answer, str) or not answer):
        raise PromptSetError(f"{where}: 'answer' must be non-empty text or left out; {example}")
    return PromptItem(pid, prompt, answer)
