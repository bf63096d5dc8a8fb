"""Persistent user settings (JSON in the platform's config folder); a bad file never stops the app."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcore.atomic import write_text as atomic_write_text
from kvcore.defaults import (
    ALLOWED_BITS,
    ALLOWED_GROUP_SIZES,
    DEFAULT_BITS,
    DEFAULT_FP_RECENT,
    DEFAULT_GROUP_SIZE,
    DEFAULT_METHOD,
    DEFAULT_RATIO,
    DEFAULT_SCHEDULE,
    DEFAULT_VALUE_BITS,
    SCHEDULES,
    UNQUANTIZED_BITS,
)

APP_NAME = "KV Lens"
MAX_RECENT = 10
_FILE_NAME = "settings.json"


def default_path() -> Path:
    """The settings file in the platform's user config folder."""
    from platformdirs import user_config_dir

    return Path(user_config_dir(APP_NAME, appauthor=False)) / _FILE_NAME


_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_bits(v: Any) -> bool:
    return v is None or (_is_int(v) and (v in ALLOWED_BITS or v == UNQUANTIZED_BITS))


def _is_ratio(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0.0 < v <= 1.0


#: Every field's type and range; a field that fails gets its default and the user one warning.
_CHECKS = {
    "geometry": lambda v: isinstance(v, str) and len(v) <= 65536 and _BASE64.fullmatch(v) is not None,
    "recent_models": lambda v: isinstance(v, list) and all(isinstance(x, str) and x.strip() for x in v),
    "recent_sessions": lambda v: isinstance(v, list) and all(isinstance(x, str) and x.strip() for x in v),
    "recent_results": lambda v: isinstance(v, list) and all(isinstance(x, str) and x.strip() for x in v),
    "last_prompt": lambda v: isinstance(v, str),
    "last_method": lambda v: isinstance(v, str) and bool(v),
    "last_ratio": _is_ratio,
    "last_bits": _is_bits,
    "last_value_bits": _is_bits,
    "last_fp_recent": lambda v: _is_int(v) and v >= 0,
    "last_group_size": lambda v: _is_int(v) and v in ALLOWED_GROUP_SIZES,
    "last_schedule": lambda v: v in SCHEDULES,
    "chat_template": lambda v: isinstance(v, bool),
    "beyond_context": lambda v: isinstance(v, bool),
    "system_prompt": lambda v: isinstance(v, str) and len(v) <= 65536,
    "last_folders": lambda v: (
        isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())
    ),
}


@dataclass
class Settings:
    """What the app remembers between runs. `geometry` is QMainWindow.saveGeometry() as base64 text;
    `last_bits` None means unquantized (the 16-bit slider stop)."""

    geometry: str = ""
    recent_models: list[str] = field(default_factory=list)
    recent_sessions: list[str] = field(default_factory=list)  # .kvlens files saved or opened, newest first
    recent_results: list[str] = field(default_factory=list)  # prompt-set results files opened, newest first
    last_prompt: str = ""
    last_method: str = DEFAULT_METHOD
    last_ratio: float = DEFAULT_RATIO
    last_bits: int | None = DEFAULT_BITS
    last_value_bits: int | None = DEFAULT_VALUE_BITS  # None: the keys' width (no split)
    last_fp_recent: int = DEFAULT_FP_RECENT  # the float residual's R (0: none)
    last_group_size: int = DEFAULT_GROUP_SIZE
    last_schedule: str = DEFAULT_SCHEDULE
    chat_template: bool = True  # the Session panel's box: apply the tokenizer's template when it has one
    system_prompt: str = ""
    beyond_context: bool = False  # the Session panel's "Past trained context" box
    #: The folder each kind of file dialog (FOLDER_KINDS) last used, so it opens there again.
    last_folders: dict[str, str] = field(default_factory=dict)
    path: Path | None = field(default=None, compare=False, repr=False)

    def add_recent_model(self, name: str) -> None:
        """Move `name` to the front of the recent list (no duplicates, at most MAX_RECENT)."""
        self.recent_models = _front(name, self.recent_models)

    def add_recent_session(self, path: str) -> None:
        """Move a session file to the front of File ▸ Open Recent Session."""
        self.recent_sessions = _front(path, self.recent_sessions)

    def add_recent_results(self, path: str) -> None:
        """Move a results file to the front of File ▸ Open Recent Results."""
        self.recent_results = _front(path, self.recent_results)

    def folder_for(self, kind: str) -> str:
        """The folder the last `kind` dialog used, if it still exists; "" (the current folder) otherwise."""
        folder = self.last_folders.get(kind, "")
        return folder if folder and Path(folder).is_dir() else ""

    def remember_folder(self, kind: str, path: str | Path) -> None:
        """Remember where a `kind` dialog chose `path` (a file's folder, or the folder itself)."""
        chosen = Path(path)
        self.last_folders[kind] = str(chosen if chosen.is_dir() else chosen.parent)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-serialisable fields (the file path is not stored)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "path"}

    @classmethod
    def load(cls, path: str | Path | None = None) -> tuple[Settings, str | None]:
        """Read settings; on a missing file return defaults, on a corrupt or unreadable one return
        defaults (or the valid fields) plus a warning for the user. Never raises."""
        target = Path(path) if path is not None else default_path()
        settings = cls(path=target)
        try:
            raw = target.read_text(encoding="utf-8")
        except FileNotFoundError:
            return settings, None
        except (OSError, UnicodeDecodeError) as exc:
            return settings, f"Could not read settings file {target}: {exc}. Using defaults."
        try:
            data = json.loads(raw)
        except ValueError as exc:
            return settings, f"Settings file {target} is corrupt ({exc}). Using defaults."
        if not isinstance(data, dict):
            return settings, f"Settings file {target} is not a JSON object. Using defaults."
        bad = []
        for name, check in _CHECKS.items():
            if name not in data:
                continue
            if check(data[name]):
                setattr(settings, name, data[name])
            else:
                bad.append(name)
        settings.recent_models = settings.recent_models[:MAX_RECENT]
        settings.recent_sessions = settings.recent_sessions[:MAX_RECENT]
        settings.recent_results = settings.recent_results[:MAX_RECENT]
        if bad:
            return settings, f"Settings file {target}: invalid {', '.join(bad)}; defaults used for those."
        return settings, None

    def save(self, path: str | Path | None = None) -> str | None:
        """Write atomically; return a warning instead of raising, so quitting never fails on a
        read-only config folder."""
        target = Path(path) if path is not None else (self.path or default_path())
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(target, json.dumps(self.to_dict(), indent=2) + "\n")
        except OSError as exc:
            return f"Could not save settings to {target}: {exc}"
        return None


def _front(item: str, items: list[str]) -> list[str]:
    """`item` first, then the others without it, at most MAX_RECENT."""
    return [item, *(x for x in items if x != item)][:MAX_RECENT]
