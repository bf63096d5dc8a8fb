"""kvzap's collected training rows: one safetensors shard per calibration prompt, so an interrupted collection
resumes where it stopped.

A shard holds, per observed layer, the attention-input rows of a sample of the prompt's positions
(`layer{i}.x` [n, hidden], float32) and their targets (`layer{i}.y` [n, H_kv]: log of kvzip+'s score), the
positions themselves, and a JSON header (format, version, prompt id, tokens, the sampling settings). Shards live in
`kvzap-<fingerprint>-shards/` in the data folder, named by a hash of the prompt id; a shard whose settings differ
from the run's is collected again; one that cannot be read, or of another format version, is refused in one line
(shards are written atomically, so only something else can have damaged one).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.defaults import KVZAP_VERSION
from kvcore.methods.calibration import data_folder, read_with_header, write_with_header

FORMAT = "kvlens-kvzap-shard"


def shard_folder(fingerprint: str) -> Path:
    return data_folder() / f"kvzap-{fingerprint[:16]}-shards"


def shard_path(folder: Path, prompt_id: str) -> Path:
    return folder / f"{hashlib.sha256(prompt_id.encode()).hexdigest()[:16]}.safetensors"


def id_order(prompt_id: str) -> int:
    """A number fixed by the prompt id alone (sampling seeds, the held-out split)."""
    return int(hashlib.sha256(prompt_id.encode()).hexdigest()[:12], 16)


def sample_positions(prompt_id: str, n_tokens: int, cap: int, seed: int) -> np.ndarray:
    """Sorted positions of the prompt whose rows are kept: all of them up to `cap`, else `cap` drawn at random
    (seeded by the seed and the prompt id, so a resumed run draws the same)."""
    if n_tokens <= cap:
        return np.arange(n_tokens, dtype=np.int64)
    rng = np.random.default_rng([seed, id_order(prompt_id)])
    return np.sort(rng.choice(n_tokens, cap, replace=False)).astype(np.int64)


@dataclass(frozen=True, eq=False)
class Shard:
    prompt_id: str
    n_tokens: int
    settings: dict[str, Any]  # positions cap, seed, target
    positions: np.ndarray  # [n]
    rows: dict[int, np.ndarray]  # layer -> [n, hidden]
    targets: dict[int, np.ndarray]  # layer -> [n, H_kv]


def write(path: Path, shard: Shard) -> None:
    header = {
        "format": FORMAT,
        "version": KVZAP_VERSION,
        "prompt_id": shard.prompt_id,
        "n_tokens": shard.n_tokens,
        "settings": shard.settings,
        "layers": sorted(shard.rows),
    }
    arrays = {"positions": mx.array(shard.positions.astype(np.int32))}
    for i in shard.rows:
        arrays[f"layer{i}.x"] = mx.array(shard.rows[i].astype(np.float32))
        arrays[f"layer{i}.y"] = mx.array(shard.targets[i].astype(np.float32))
    write_with_header(path, arrays, header)


def read(path: Path) -> Shard:
    """The shard in `path`; ValueError in one line when it is not one."""
    try:
        arrays, header = read_with_header(path)
        layers = [int(i) for i in header["layers"]]
        rows = {i: np.array(arrays[f"layer{i}.x"]) for i in layers}
        targets = {i: np.array(arrays[f"layer{i}.y"]) for i in layers}
        shard = Shard(
            str(header["prompt_id"]),
            int(header["n_tokens"]),
            dict(header["settings"]),
            np.array(arrays["positions"]).astype(np.int64),
            rows,
            targets,
        )
    except (OSError, RuntimeError, ValueError, KeyError, TypeError) as exc:
        why = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise ValueError(
            f"{path}: not a readable kvzap shard ({why}): delete it and run `kvlens calibrate kvzap` again"
        ) from None
    if header.get("format") != FORMAT or header.get("version") != KVZAP_VERSION:
        raise ValueError(f"{path}: not a kvzap shard: delete it and run `kvlens calibrate kvzap` again")
    return shard


def current(path: Path, prompt_id: str, settings: dict[str, Any]) -> Shard | None:
    """The shard at `path` when it holds this prompt collected with these settings (resume); None when there is
    none or it was collected otherwise (another version or settings: it is collected again)."""
    if not path.exists():
        return None
    shard = read(path)
    return shard if (shard.prompt_id, shard.settings) == (prompt_id, settings) else None
