"""Pin and diff: keep the configuration on screen and its kept mask as B, and compare every later one with it.

The pin is plain NumPy taken from the CompressionView on screen, so a slider move is compared with it on the
GUI thread without an engine call. It survives slider moves (that is its point); a new prefill or another
model changes what the positions are, so it is cleared then and the status bar says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QToolBar

from app.controllers.host import Host, baseline_dtype
from app.engine.view_model import CompressionView
from app.widgets.config_text import config_label
from app.widgets.heatmap import VIEW_DIFF
from kvcore.measure.export import CONFIG_COLUMNS, stats_columns
from kvcore.measure.metrics import kept_jaccard

PIN_SHORTCUT = "Ctrl+P"
UNPIN_SHORTCUT = "Ctrl+Shift+P"


def _keys(shortcut: str) -> str:
    return QKeySequence(shortcut).toString(QKeySequence.SequenceFormat.NativeText)


@dataclass(frozen=True)
class Pin:
    """Configuration B: its settings, its label and what it kept, [L, H_kv, T] over the prompt positions."""

    config: dict[str, Any]
    label: str
    kept: np.ndarray
    cells: dict[str, Any]  # the pinned_* columns of every statistics row


def pin_of(view: CompressionView, baseline: str | None = None) -> Pin:
    """The pin of a shown compression result; `baseline` (the dense cache's element type) names an unquantized
    side in its label."""
    T = view.n_prompt_positions
    kept = view.kept[:, :T].reshape(view.n_layers, view.n_kv_heads, T).copy()
    first = view.stats_rows[0] if view.stats_rows else {}
    cells = {f"pinned_{c}": first.get(c) for c in CONFIG_COLUMNS}
    return Pin(dict(view.config), config_label(view.config, baseline), kept, cells)


def pinned_rows(view: CompressionView, pin: Pin) -> list[dict[str, Any]]:
    """The view's statistics rows with the pinned configuration and the per-layer Jaccard appended.

    Positions are compared one by one over the positions either could evict: a schedule that compresses one
    position fewer stores that position (the last prompt token), as the views' always-stored tail does.
    """
    L, H, T_pin = pin.kept.shape
    T = max(T_pin, view.n_prompt_positions)
    current = view.kept[:, :T].reshape(L, H, T)
    pinned = np.ones((L, H, T), dtype=bool)
    pinned[:, :, :T_pin] = pin.kept
    jaccard = kept_jaccard(current, pinned)
    return [dict(row, **pin.cells, jaccard_vs_pinned=float(jaccard[row["layer"]])) for row in view.stats_rows]


class PinController:
    """The Pin / Unpin actions (toolbar here; the window's Compare menu lists `actions`), the pinned state,
    and what it adds to the views."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.pin_state: Pin | None = None
        self._current: CompressionView | None = None
        self.pinAction = self._action("&Pin Configuration", self.pin, PIN_SHORTCUT)
        self.pinAction.setStatusTip("Keep this configuration as B; the heatmap's Diff view compares with it")
        self.unpinAction = self._action("&Unpin", self.unpin, UNPIN_SHORTCUT)
        self.unpinAction.setStatusTip("Forget the pinned configuration")
        self.actions = (self.pinAction, self.unpinAction)
        toolbar = QToolBar("Compare", host.widget, objectName="compareToolBar")
        for action in self.actions:
            toolbar.addAction(action)
        host.widget.addToolBar(toolbar)
        self._update_actions()

    @property
    def current(self) -> CompressionView | None:
        """The compression result on screen (what Pin would pin, what Save keeps); None before one is shown."""
        return self._current

    def _action(self, text: str, slot, shortcut: str) -> QAction:  # noqa: ANN001
        action = QAction(text, self.host.widget)
        action.setShortcut(QKeySequence(shortcut))
        action.setToolTip(f"{text.replace('&', '')} ({_keys(shortcut)})")
        action.triggered.connect(lambda _=False: slot())
        self.host.widget.addAction(action)
        return action

    def pin(self) -> bool:
        """Pin the configuration on screen as B and switch the heatmap to the Diff view."""
        view = self._current
        if view is None:
            self.host.status.show("Nothing to pin yet: Prefill a prompt first.")
            return False
        self.pin_state = pin_of(view, baseline_dtype(self.host))
        rows = view.n_layers * view.n_kv_heads
        self.host.heatmap.set_pinned(self.pin_state.kept.reshape(rows, -1), self.pin_state.label)
        self.host.heatmap.set_view(VIEW_DIFF)
        table = self.host.statsTable
        table.set_rows(*self.on_compression(view))
        for column in range(len(stats_columns(pinned=False)), len(table.columns())):
            table.resizeColumnToContents(column)
        self._update_actions()
        self.host.status.show(
            f"Pinned {self.pin_state.label} as B: the Diff view and the jaccard_vs_pinned column compare "
            f"every setting with it ({_keys(UNPIN_SHORTCUT)} unpins)."
        )
        return True

    def restore(self, pin: Pin) -> None:
        """Pin `pin` again (a session file kept it) over the view on screen, as `pin` would."""
        view = self._current
        if view is None or pin.kept.shape != (view.n_layers, view.n_kv_heads, pin.kept.shape[2]):
            return
        self.pin_state = pin
        self.host.heatmap.set_pinned(pin.kept.reshape(view.n_layers * view.n_kv_heads, -1), pin.label)
        self.host.statsTable.set_rows(*self.on_compression(view))

    def unpin(self) -> None:
        """Forget B; the Diff view and the pinned columns go away."""
        if self.pin_state is None:
            return
        label = self.pin_state.label
        self._drop()
        self.host.status.show(f"Unpinned {label}.")

    def clear(self, reason: str) -> str:
        """Drop the pin because of `reason`; the sentence to show, or '' when nothing was pinned."""
        self._current = None
        if self.pin_state is None:
            self._update_actions()
            return ""
        label = self.pin_state.label
        self._drop()
        return f"Pin {label} cleared: {reason}."

    def on_compression(self, view: CompressionView) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
        """Remember `view` as the one on screen; its statistics rows and columns, with B's when pinned."""
        self._current = view
        self._update_actions()
        pin = self.pin_state
        if pin is None:
            return view.stats_rows, stats_columns(pinned=False)
        if pin.kept.shape[:2] != (view.n_layers, view.n_kv_heads):
            self._drop()  # cannot happen after clear() on prefill; never compare different positions
            return view.stats_rows, stats_columns(pinned=False)
        return pinned_rows(view, pin), stats_columns(pinned=True)

    def _drop(self) -> None:
        self.pin_state = None
        self.host.heatmap.set_pinned(None)
        view = self._current
        if view is not None:
            self.host.statsTable.set_rows(view.stats_rows, stats_columns(pinned=False))
        self._update_actions()

    def _update_actions(self) -> None:
        self.pinAction.setEnabled(self._current is not None)
        self.unpinAction.setEnabled(self.pin_state is not None)
