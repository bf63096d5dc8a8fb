"""kvzap's trained surrogate: per layer a linear map or a two-layer MLP from the attention input to one score per
kv-head, and the file `kvlens calibrate kvzap` writes it to.

The file is safetensors in the user data folder (`kvcore.methods.calibration.data_folder`), named by type and
model fingerprint (`kvzap-mlp-<fp>.safetensors`, `kvzap-linear-<fp>.safetensors`): float32 arrays per observed
layer in torch's `nn.Linear` layout ([out, in]) — `layer{i}.w1`, `b1`, `w2`, `b2` (mlp: hidden → hidden_dim →
GELU → H_kv) or `layer{i}.w`, `b` (linear) — and one JSON header in the metadata: format, version, model_type,
fingerprint, the layers, the training settings and figures (held-out R², Jaccard against kvzip). Written
atomically; a file that is not one is refused in one line and left alone.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from kvcore.defaults import KVZAP_VERSION
from kvcore.methods.calibration import data_folder, read_once, read_with_header, write_with_header

FORMAT = "kvlens-kvzap"
MODEL_TYPES = ("mlp", "linear")
_NAMES = {"mlp": ("w1", "b1", "w2", "b2"), "linear": ("w", "b")}


def surrogate_path(model_type: str, fingerprint: str) -> Path:
    """Where `kvlens calibrate kvzap --kvzap-type TYPE` writes the surrogate of the model with `fingerprint`."""
    return data_folder() / f"kvzap-{model_type}-{fingerprint[:16]}.safetensors"


def calibrate_command(model_type: str, model: str) -> str:
    """The command that trains the surrogate (quoted for a shell)."""
    extra = "" if model_type == "mlp" else f" --kvzap-type {model_type}"
    return f"kvlens calibrate kvzap --model {shlex.quote(model)} --prompts DIR{extra}"


@dataclass(frozen=True, eq=False)
class Surrogate:
    """One model's trained kvzap surrogate: per observed layer its float32 weights ([out, in]) by name."""

    model_type: str
    fingerprint: str
    weights: dict[int, dict[str, np.ndarray]]
    header: dict[str, Any]
    _on_device: dict[int, dict[str, mx.array]] = field(default_factory=dict, repr=False)

    @property
    def digest(self) -> str:
        """What a ranking is keyed by: the weights' bytes (a retrained surrogate scores anew)."""
        h = hashlib.sha256(f"{self.model_type}:{self.fingerprint}".encode())
        for layer in sorted(self.weights):
            for name in _NAMES[self.model_type]:
                h.update(np.ascontiguousarray(self.weights[layer][name]).tobytes())
        return h.hexdigest()

    def scores(self, layer: int, rows: mx.array) -> mx.array:
        """[H_kv, N] float32: the surrogate of `layer` on attention-input rows [N, hidden] (kvpress's output,
        transposed). ValueError when the layer was not trained."""
        w = self.weights.get(layer)
        if w is None:
            raise ValueError(
                f"the kvzap surrogate has no layer {layer}: calibrate again with this model "
                f"(`{calibrate_command(self.model_type, 'M')}`)"
            )
        if layer not in self._on_device:  # converted once per layer, not per chunk
            self._on_device[layer] = {k: mx.array(v) for k, v in w.items()}
        return forward(self.model_type, self._on_device[layer], rows).T


def forward(model_type: str, w: dict[str, mx.array], rows: mx.array) -> mx.array:
    """[N, H_kv]: one layer's surrogate on rows [N, hidden] (float32), weights in [out, in] layout."""
    x = rows.astype(mx.float32)
    if model_type == "linear":
        return x @ w["w"].T + w["b"]
    hidden = nn.gelu(x @ w["w1"].T + w["b1"])  # the exact (erf) GELU, as torch's nn.GELU()
    return hidden @ w["w2"].T + w["b2"]


def write(path: Path, surrogate: Surrogate) -> None:
    """Write `surrogate` atomically (the folder is created)."""
    header = {
        **surrogate.header,
        "format": FORMAT,
        "version": KVZAP_VERSION,
        "method": "kvzap",
        "model_type": surrogate.model_type,
        "model_fingerprint": surrogate.fingerprint,
        "layers": sorted(surrogate.weights),
    }
    arrays = {
        f"layer{i}.{name}": mx.array(np.asarray(a, np.float32))
        for i, w in surrogate.weights.items()
        for name, a in w.items()
    }
    write_with_header(path, arrays, header)


def read(path: Path, model_type: str | None = None, fingerprint: str | None = None) -> Surrogate:
    """The surrogate in `path`; ValueError in one line when it is not one (of `model_type`, for `fingerprint`)."""
    fix = f"delete {path} and run `kvlens calibrate kvzap` again"
    try:
        arrays, header = read_with_header(path)
        kind = str(header["model_type"])
        weights = {
            int(i): {n: np.array(arrays[f"layer{i}.{n}"], np.float32) for n in _NAMES[kind]}
            for i in header["layers"]
        }
    except (OSError, RuntimeError, ValueError, KeyError, TypeError) as exc:
        why = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise ValueError(f"{path}: not a readable KV Lens kvzap surrogate ({why}): {fix}") from None
    if header.get("format") != FORMAT or header.get("version") != KVZAP_VERSION:
        raise ValueError(
            f"{path}: kvzap format {header.get('format')!r} version {header.get('version')!r}, this KV Lens "
            f"reads {FORMAT!r} version {KVZAP_VERSION}: {fix}"
        )
    if model_type is not None and kind != model_type:
        raise ValueError(f"{path}: a {kind} surrogate, not {model_type}: {fix}")
    if fingerprint is not None and header.get("model_fingerprint") != fingerprint:
        raise ValueError(f"{path}: trained on another model (fingerprint differs): {fix}")
    return Surrogate(kind, str(header["model_fingerprint"]), weights, header)


def load(model_type: str, fingerprint: str, model: str) -> Surrogate:
    """The surrogate of this type for the model with `fingerprint`; ValueError with the command that trains it
    when there is none. Read once per file version."""
    missing = (
        f"kvzap needs a {model_type} surrogate trained for this model, and there is none: run "
        f"`{calibrate_command(model_type, model)}` (a folder of sample prompts), then choose kvzap again"
    )
    path = surrogate_path(model_type, fingerprint)
    return read_once(path, missing, lambda p: read(p, model_type, fingerprint))
