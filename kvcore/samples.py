"""The sample prompts and their one-line notes (what to look for), shared by the app's list and the README."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

NOTES_FILE = "notes.json"


@dataclass(frozen=True)
class SamplePrompt:
    path: Path
    note: str

    @property
    def title(self) -> str:
        return self.path.stem.replace("_", " ")


def sample_prompts(folder: Path | None) -> list[SamplePrompt]:
    """Every `*.txt` in `folder`, in name order, with its note from `notes.json` ("" when none or unreadable)."""
    if folder is None or not folder.is_dir():
        return []
    try:
        notes = json.loads((folder / NOTES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        notes = {}
    if not isinstance(notes, dict):
        notes = {}
    return [SamplePrompt(path, str(notes.get(path.name, ""))) for path in sorted(folder.glob("*.txt"))]
