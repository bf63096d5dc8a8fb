"""What a session file's `extra` brings back to the window — prompt, controls, view, pin — checked whole.

Every field is checked by type and range here, before the engine's session, the pin or the view change, so a
forged (re-sealed) file is refused with the field it got wrong and never half-applies. Fields an older file did not
write are absent (None) and leave their widget as it is; a field that is present must be right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.controllers.pinning import Pin
from app.engine import view_store
from app.engine.view_checks import check_cells, check_config, check_fits, require
from app.engine.view_model import CompressionView
from app.widgets.heatmap import VIEWS
from kvcore.defaults import DEFAULT_FP_RECENT


@dataclass(frozen=True)
class SavedScreen:
    """A session file's `extra`, typed: what the window shows again after an open."""

    prompt: str
    config: dict[str, Any] | None
    auto_regenerate: bool | None
    heatmap_view: str | None
    chat_template: bool | None
    system_prompt: str | None
    view: CompressionView | None
    pin: Pin | None


def _optional(extra: dict[str, Any], key: str, kind: type, expected: str) -> Any:
    value = extra.get(key)
    require(value is None or isinstance(value, kind), f"extra: {key}", expected)
    return value


def _pin(extra: dict[str, Any], arrays: dict[str, np.ndarray]) -> Pin | None:
    pin = extra.get("pin")
    if pin is None:
        return None
    require(isinstance(pin, dict), "pin", "an object with config, label and cells")
    config = check_config(pin.get("config"), "pin: config")
    label = pin.get("label")
    require(isinstance(label, str), "pin: label", "text")
    cells = check_cells(pin.get("cells", {}), "pin: cells")
    kept = arrays.get("pin.kept")
    ok = isinstance(kept, np.ndarray) and kept.dtype == bool and kept.ndim == 3 and 0 not in kept.shape
    require(ok, "pin: kept", "a bool mask over layers x kv-heads x prompt positions")
    return Pin(dict(config), label, kept, dict(cells))


def check_saved(extra: Any, arrays: dict[str, np.ndarray]) -> SavedScreen:
    """Every field of `extra` (and its arrays) by type and range; ValueError "<field> must be …" otherwise."""
    require(isinstance(extra, dict), "extra", "an object")
    prompt = _optional(extra, "prompt", str, "text")
    config = extra.get("config")
    if config is not None:  # files from before the float residual had none: 0
        config = check_config(
            {"fp_recent": DEFAULT_FP_RECENT, **config} if isinstance(config, dict) else config,
            "extra: config",
        )
    view_name = extra.get("heatmap_view")
    require(view_name is None or view_name in VIEWS, "extra: heatmap_view", f"one of {', '.join(VIEWS)}")
    view = None if extra.get("view") is None else view_store.unpack(extra["view"], arrays)
    pin = _pin(extra, arrays)
    if pin is not None and view is not None:
        want = (view.n_layers, view.n_kv_heads)
        require(
            pin.kept.shape[:2] == want and pin.kept.shape[2] <= view.kept.shape[1],
            "pin: kept",
            f"a bool mask over {want[0]} layers x {want[1]} kv-heads and at most {view.kept.shape[1]} positions",
        )
    return SavedScreen(
        prompt=prompt or "",
        config=config,
        auto_regenerate=_optional(extra, "auto_regenerate", bool, "true or false"),
        heatmap_view=view_name,
        chat_template=_optional(extra, "chat_template", bool, "true or false"),
        system_prompt=_optional(extra, "system_prompt", str, "text"),
        view=view,
        pin=pin if view is not None else None,
    )


def check_restored(
    saved: SavedScreen, n_layers: int, n_kv_heads: int, n_columns: int, prompt_len: int
) -> None:
    """The checked screen against the restored session (its model and prompt)."""
    if saved.view is not None:
        check_fits(saved.view, n_layers, n_kv_heads, n_columns, prompt_len)
