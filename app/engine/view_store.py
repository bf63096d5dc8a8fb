"""A CompressionView as JSON plus named NumPy arrays, for session files (kvcore.engine.session_file's `extra`).

Opening a session shows the saved view as it was — heatmap, statistics, metrics, continuations — without
asking the engine to regenerate (no forward pass). Arrays go into the safetensors file, everything else into
its JSON; reading back checks every field (app.engine.view_checks), so a forged file fails with "view: …".
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from app.engine.stored_view import ChannelView
from app.engine.view_checks import check_view
from app.engine.view_model import CompressionView, SequenceView, TokenSteps

_NESTED = {"sequence": SequenceView, "token_steps": TokenSteps, "key_channels": ChannelView}


def _plain(value: Any) -> Any:
    """JSON-ready: NumPy scalars become Python numbers, containers are walked."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def pack(view: Any, prefix: str = "view.") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(JSON fields, arrays named prefix + field) of a view dataclass, nested dataclasses included."""
    fields: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for f in dataclasses.fields(view):
        value = getattr(view, f.name)
        if isinstance(value, np.ndarray):
            arrays[prefix + f.name] = value
            fields[f.name] = {"array": prefix + f.name}
        elif dataclasses.is_dataclass(value):
            inner, inner_arrays = pack(value, f"{prefix}{f.name}.")
            fields[f.name] = {"dataclass": inner}
            arrays.update(inner_arrays)
        else:
            fields[f.name] = _plain(value)
    return fields, arrays


def _unpack(cls: type, fields: Any, arrays: dict[str, np.ndarray]) -> Any:
    if not isinstance(fields, dict):
        raise ValueError(f"view: {cls.__name__} must be an object")
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in fields:
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if has_default:  # a field added after the file was written (key_channels): its default
                continue
            raise ValueError(f"view: {cls.__name__}.{f.name} is missing")
        value = fields[f.name]
        if isinstance(value, dict) and set(value) == {"array"}:
            if not isinstance(value["array"], str) or value["array"] not in arrays:
                raise ValueError(f"view: array {value['array']!r} is missing")
            value = arrays[value["array"]]
        elif isinstance(value, dict) and set(value) == {"dataclass"}:
            if f.name not in _NESTED:
                raise ValueError(f"view: {cls.__name__}.{f.name} cannot be a nested object")
            value = _unpack(_NESTED[f.name], value["dataclass"], arrays)
        values[f.name] = value
    return cls(**values)


def unpack(fields: Any, arrays: dict[str, np.ndarray]) -> CompressionView:
    """The view `pack` wrote, every field checked by type, range and against the others
    (app.engine.view_checks); `view_checks.check_fits` then checks it against the restored session."""
    view = _unpack(CompressionView, fields, arrays)
    check_view(view)
    return view
