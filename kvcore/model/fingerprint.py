"""A model's identity on disk: what a session file and a calibration artifact are keyed by."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def model_fingerprint(path: str | os.PathLike) -> str:
    """SHA-256 of the model folder's config.json and weight index (or weight names and sizes without one)."""
    folder = Path(path)
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors.index.json"):
        f = folder / name
        h.update(name.encode() + b"|" + (f.read_bytes() if f.is_file() else b"-") + b"|")
    if not (folder / "model.safetensors.index.json").is_file():
        for f in sorted(folder.glob("*.safetensors")):
            h.update(f"{f.name}:{f.stat().st_size}|".encode())
    return h.hexdigest()
