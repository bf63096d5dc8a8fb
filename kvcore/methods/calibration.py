"""Calibration artifacts of the calibrated methods (qfilter, expected_attention_stats): the query statistics of a
model over the user's own prompts, computed on the user's machine (`kvlens calibrate`), where kvpress downloads them
for a few models.

An artifact is one safetensors file in the user data folder (platformdirs; `KVLENS_DATA_DIR` overrides it), named
by method and model fingerprint. Its arrays are, per observed layer, the running statistics of the pre-RoPE queries
of every query head at positions ≥ `skip` of each prompt — count, mean and centred sum of outer products, merged
prompt by prompt (Chan's pairwise update) — and its safetensors metadata holds one JSON header: format, version,
method, model fingerprint, n_prompts, the ids of the prompts folded in (so a resumed run skips them) and the counts.
A method may add a per-prompt array of its own per layer, summed over the prompts (duo_attention_calibrated).
Files are written atomically; a file that cannot be read as such is refused in one line and never overwritten.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.atomic import atomic_path
from kvcore.capture.query_stats import QueryStats, merge
from kvcore.defaults import APP_DATA_NAME, CALIBRATION_VERSION, DATA_DIR_ENV
from kvcore.model.fingerprint import model_fingerprint

FORMAT = "kvlens-calibration"
_HEADER = "kvlens"  # the metadata key holding the JSON header


def data_folder() -> Path:
    """The folder artifacts live in: `$KVLENS_DATA_DIR`, else the platform's user data folder + calibration."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override)
    from platformdirs import user_data_dir

    return Path(user_data_dir(APP_DATA_NAME, appauthor=False)) / "calibration"


def artifact_path(method: str, fingerprint: str) -> Path:
    """Where `kvlens calibrate METHOD` writes the artifact of the model with this fingerprint."""
    return data_folder() / f"{method}-{fingerprint[:16]}.safetensors"


def model_key(model_path: str) -> str:
    """What artifacts are keyed by: the folder's fingerprint (config and weight files), or, for a model mlx-lm
    downloaded by repo id (no local folder to read), a hash of that id — never one key shared by all of them."""
    if Path(model_path).is_dir():
        return model_fingerprint(model_path)
    return hashlib.sha256(f"repo:{model_path}".encode()).hexdigest()


def calibrate_command(method: str, model: str) -> str:
    """The command that makes `method`'s artifact for `model` (quoted for a shell)."""
    return f"kvlens calibrate {method} --model {shlex.quote(model)} --prompts DIR"


@dataclass(frozen=True, eq=False)
class Artifact:
    """One method's calibration of one model: per layer (None: not observed) count, mean [H_q, D], m2 [H_q, D, D]."""

    method: str
    fingerprint: str
    skip: int  # positions of each prompt left out (expected_attention_stats' sinks)
    done: tuple[str, ...]  # ids of the prompts folded in, in order
    counts: tuple[int | None, ...]
    means: tuple[np.ndarray | None, ...]
    m2s: tuple[np.ndarray | None, ...]
    #: per layer, the sum over prompts of a method's own per-prompt array (duo_attention_calibrated's head scores)
    sums: tuple[np.ndarray | None, ...] = ()

    @property
    def n_prompts(self) -> int:
        return len(self.done)

    @property
    def digest(self) -> str:
        """What a ranking is keyed by: the statistics' bytes (a recalibrated model scores anew)."""
        h = hashlib.sha256(json.dumps([self.method, self.fingerprint, self.skip, self.counts]).encode())
        for a in (*self.means, *self.m2s, *self.sums):
            h.update(b"-" if a is None else np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    def covariance(self, layer: int, unbiased: bool = True) -> np.ndarray:
        """[H_q, D, D] float64: m2 / (n − 1) (kvpress's statistics) or m2 / n."""
        n = self._count(layer)
        return np.asarray(self.m2s[layer], np.float64) / max(n - 1 if unbiased else n, 1)

    def mean(self, layer: int) -> np.ndarray:
        """[H_q, D] float64."""
        self._count(layer)
        return np.asarray(self.means[layer], np.float64)

    def second_moment(self, layer: int) -> np.ndarray:
        """[H_q, D, D] float64: Σ q qᵀ over every calibration query (uncentred)."""
        n, mean = self._count(layer), self.mean(layer)
        return np.asarray(self.m2s[layer], np.float64) + n * mean[:, :, None] * mean[:, None, :]

    def _count(self, layer: int) -> int:
        n = self.counts[layer] if layer < len(self.counts) else None
        if not n:
            raise ValueError(
                f"the {self.method} calibration has no queries of layer {layer}: calibrate again with this model"
            )
        return n

    def folded(
        self, prompt_id: str, stats: list[QueryStats | None], samples: list[np.ndarray | None] | None = None
    ) -> Artifact:
        """This artifact with one more prompt's pre-RoPE query statistics (a capture's, per layer) merged in, and
        its per-layer `samples` (float32) added to the sums."""
        if len(self.counts) not in (0, len(stats)):
            raise ValueError(
                f"{self.method} calibration: {len(self.counts)} layers, the model has {len(stats)}"
            )
        counts, means, m2s = [], [], []
        for i, layer in enumerate(stats):
            old = (self.counts[i], self.means[i], self.m2s[i]) if self.counts else (None, None, None)
            new = None if layer is None else _prompt_moments(layer, self.skip)
            if new is None:
                counts.append(old[0]), means.append(old[1]), m2s.append(old[2])
                continue
            if old[0]:
                n, mean, m2 = _combine(old, new)
            else:
                n, mean, m2 = new
            counts.append(n), means.append(mean), m2s.append(m2)
        sums = self.sums
        if samples is not None:
            old_sums = self.sums or (None,) * len(samples)
            sums = tuple(
                a if b is None else (b.astype(np.float32) if a is None else (a + b.astype(np.float32)))
                for a, b in zip(old_sums, samples, strict=True)
            )
        return dataclasses.replace(
            self,
            done=(*self.done, prompt_id),
            counts=tuple(counts),
            means=tuple(means),
            m2s=tuple(m2s),
            sums=sums,
        )


def empty(method: str, fingerprint: str, skip: int) -> Artifact:
    return Artifact(method, fingerprint, skip, (), (), (), ())


def _prompt_moments(stats: QueryStats, skip: int) -> tuple[int, np.ndarray, np.ndarray] | None:
    """(n, mean, m2) of one prompt's queries at positions ≥ skip, float32 NumPy; None when there are none."""
    rows = stats.head[:, skip:]
    count, mean, m2 = stats.count, stats.mean, stats.m2
    if rows.shape[1]:
        count, mean, m2 = merge(count, mean, m2, rows)
    if not count or mean is None or m2 is None:
        return None
    return count, np.array(mean, np.float32), np.array(m2, np.float32)


def _combine(
    a: tuple[Any, Any, Any], b: tuple[int, np.ndarray, np.ndarray]
) -> tuple[int, np.ndarray, np.ndarray]:
    """Chan's pairwise merge of two (n, mean, m2) summaries, float32 as stored."""
    (na, ma, sa), (nb, mb, sb) = a, b
    n = na + nb
    delta = mb - ma
    mean = (ma + delta * np.float32(nb / n)).astype(np.float32)
    m2 = sa + sb + delta[:, :, None] * delta[:, None, :] * np.float32(na * nb / n)
    return n, mean, m2.astype(np.float32)


def write(path: Path, artifact: Artifact) -> None:
    """Write `artifact` atomically (the folder is created)."""
    header = {
        "format": FORMAT,
        "version": CALIBRATION_VERSION,
        "method": artifact.method,
        "model_fingerprint": artifact.fingerprint,
        "n_prompts": artifact.n_prompts,
        "done": list(artifact.done),
        "skip": artifact.skip,
        "counts": list(artifact.counts),
        "sums": [s is not None for s in artifact.sums],
    }
    arrays = {}
    for i, (mean, m2) in enumerate(zip(artifact.means, artifact.m2s, strict=True)):
        if mean is not None and m2 is not None:
            arrays[f"layer{i}.mean"], arrays[f"layer{i}.m2"] = mx.array(mean), mx.array(m2)
    for i, total in enumerate(artifact.sums):
        if total is not None:
            arrays[f"layer{i}.sum"] = mx.array(total)
    if not arrays:
        arrays["empty"] = mx.zeros((0,), mx.float32)
    write_with_header(path, arrays, header)


def write_with_header(path: Path, arrays: dict[str, mx.array], header: dict[str, Any]) -> None:
    """Arrays and one JSON header (the safetensors metadata) written atomically; the folder is created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temp:
        mx.save_safetensors(str(temp), arrays, metadata={_HEADER: json.dumps(header)})


def read_with_header(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """(arrays, header) of a file `write_with_header` wrote; OSError, ValueError or KeyError when it is not one."""
    arrays, metadata = mx.load(str(path), format="safetensors", return_metadata=True)
    return arrays, json.loads(metadata[_HEADER])


def read(path: Path, of: str | None = None, fingerprint: str | None = None) -> Artifact:
    """The artifact in `path`; ValueError in one line when it is not one (of method `of`, for `fingerprint`)."""
    fix = f"delete {path} and run `kvlens calibrate` again"
    try:
        arrays, metadata = mx.load(str(path), format="safetensors", return_metadata=True)
        header = json.loads(metadata[_HEADER])
        counts = tuple(header["counts"])
        done = tuple(str(d) for d in header["done"])
        skip = int(header["skip"])
        means = tuple(None if not n else np.array(arrays[f"layer{i}.mean"]) for i, n in enumerate(counts))
        m2s = tuple(None if not n else np.array(arrays[f"layer{i}.m2"]) for i, n in enumerate(counts))
        sums = tuple(
            np.array(arrays[f"layer{i}.sum"]) if s else None for i, s in enumerate(header.get("sums", []))
        )
    except (OSError, RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable KV Lens calibration file ({_short(exc)}): {fix}") from None
    if header.get("format") != FORMAT or header.get("version") != CALIBRATION_VERSION:
        raise ValueError(
            f"{path}: calibration format {header.get('format')!r} version {header.get('version')!r}, "
            f"this KV Lens reads {FORMAT!r} version {CALIBRATION_VERSION}: {fix}"
        )
    if of is not None and header.get("method") != of:
        raise ValueError(f"{path}: a calibration of {header.get('method')!r}, not {of!r}: {fix}")
    if fingerprint is not None and header.get("model_fingerprint") != fingerprint:
        raise ValueError(f"{path}: calibrated on another model (fingerprint differs): {fix}")
    return Artifact(
        str(header["method"]), str(header["model_fingerprint"]), skip, done, counts, means, m2s, sums
    )


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:120] or type(exc).__name__


_loaded: dict[tuple[str, int, int], Any] = {}


def read_once(path: Path, missing: str, reader: Callable[[Path], Any]) -> Any:
    """`reader(path)`, read once per file version (path, mtime, size); ValueError(`missing`) when there is no file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ValueError(missing) from None
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _loaded:
        _loaded[key] = reader(path)
    return _loaded[key]


def load(method: str, fingerprint: str, model: str) -> Artifact:
    """`method`'s artifact for the model with `fingerprint`; ValueError with the command that makes it when there is
    none. Read once per file version."""
    missing = (
        f"{method} needs a calibration of this model, and there is none: run "
        f"`{calibrate_command(method, model)}` (a folder of sample prompts), then choose {method} again"
    )
    return read_once(artifact_path(method, fingerprint), missing, lambda p: read(p, method, fingerprint))


def needs_artifact(method: Any) -> bool:
    """Whether `method` (or a method it wraps or chains) reads a calibration artifact."""
    inner = getattr(method, "inner", None)
    if inner is not None:
        return needs_artifact(inner)
    stages = getattr(method, "stages", None)
    if stages is not None:
        return any(needs_artifact(s) for s in stages)
    return bool(getattr(method, "calibration", ""))


def bind(method: Any, fingerprint: str, model: str) -> Any:
    """`method` (or the methods it wraps or chains) with its calibration artifact attached, when it needs one."""
    inner = getattr(method, "inner", None)
    if inner is not None:
        bound = bind(inner, fingerprint, model)
        return method if bound is inner else dataclasses.replace(method, inner=bound)
    stages = getattr(method, "stages", None)
    if stages is not None:
        bound_stages = tuple(bind(s, fingerprint, model) for s in stages)
        return method if bound_stages == stages else dataclasses.replace(method, stages=bound_stages)
    name = getattr(method, "calibration", "")
    if not name:
        return method
    own = getattr(method, "load_calibration", None)  # an artifact of another kind (kvzap's trained surrogate)
    return method.with_artifact(own(fingerprint, model) if own else load(name, fingerprint, model))
