"""ThinK's kept key channels (issue 38): x = key channel (0 … head_dim − 1), y = (layer, kv-head) as in the heatmap,
colour = stored or pruned. ThinK stores each head's kept prompt rows with narrow keys (kvcore.cache.channel_pruned),
so a row's pruned share is memory saved; the hover says the head's kept count and the bytes.

Fed an app.engine.stored_view.ChannelView (plain arrays); it never talks to the engine.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.engine.stored_view import ChannelView
from app.widgets.heatmap import KEPT_RGBA
from app.widgets.hover import HoverLine
from app.widgets.plot_export import export_graphics
from app.widgets.row_axis import RowAxis

#: The line under the view when nothing is hovered (the hover text goes there and to the status bar).
HOVER_HINT = "Hover a cell: the head's stored channels and the bytes its pruned ones save."
#: Said instead of the map when the method stores every key channel.
NO_CHANNELS = (
    "Every key channel is stored: only ThinK (think over snapkv, or think-METHOD over another per-head scorer) "
    "prunes key channels."
)
PRUNED_RGBA = (90, 90, 100, 255)  # the heatmap legend's lifted "evicted" grey: visible on the dark background
_LEGEND = (
    f'<span style="color: rgb{KEPT_RGBA[:3]}">■</span> stored &nbsp;'
    f'<span style="color: rgb{PRUNED_RGBA[:3]}">■</span> pruned (not stored)'
)


def render_channels(kept: np.ndarray) -> np.ndarray:
    """[rows, D] bool -> [rows, D, 4] uint8: stored channels orange, pruned ones grey."""
    return np.array([PRUNED_RGBA, KEPT_RGBA], dtype=np.uint8)[kept.view(np.uint8)]


def _bytes(n: int) -> str:
    return f"{n / 1024:,.1f} KiB" if n >= 1024 else f"{n:,} B"


class ChannelMap(QWidget):
    """The kept-channel map with a one-line summary above it (or why there is no map)."""

    hoverInfo = Signal(str)  # noqa: N815 (Qt signal naming)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("channelMap")
        self._view: ChannelView | None = None
        self._labels: list[str] = []
        self._heads = 1
        self._last: tuple[int, int] | None = None
        self.noteLabel = QLabel(NO_CHANNELS, objectName="channelMapNote")
        self.noteLabel.setWordWrap(True)
        self.legendLabel = QLabel(_LEGEND, objectName="channelMapLegend")
        self.exportImageButton = QPushButton("Image…", objectName="channelMapExportButton")
        self.exportImageButton.setToolTip("Save the channel map as PNG or SVG")
        self._y_axis = RowAxis()
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setObjectName("channelMapGraphics")
        self.plot = self.graphics.addPlot(row=0, col=0, axisItems={"left": self._y_axis})
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.invertY(True)
        self.plot.setLabel("bottom", "key channel (of head_dim)")
        self.plot.getAxis("bottom").enableAutoSIPrefix(False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.setSpacing(2)
        layout.addWidget(self.noteLabel)
        self.legendRow = QWidget(objectName="channelMapLegendRow")
        row = QHBoxLayout(self.legendRow)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.legendLabel, 1)
        row.addWidget(self.exportImageButton)
        layout.addWidget(self.legendRow)
        layout.addWidget(self.graphics, 1)
        self.hoverLabel = HoverLine(HOVER_HINT, "channelMapHover")
        layout.addWidget(self.hoverLabel)
        self.graphics.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.set_view(None, [], 1)

    def set_view(self, view: ChannelView | None, row_labels: list[str], n_kv_heads: int) -> None:
        """Show a compression's kept channels (None: the method stores them all, said in one line)."""
        self._view, self._labels, self._heads = view, list(row_labels), max(1, n_kv_heads)
        self._last = None
        self.graphics.setVisible(view is not None)
        self.legendRow.setVisible(view is not None)
        self.hoverLabel.setVisible(view is not None)
        if view is None:
            self.noteLabel.setText(NO_CHANNELS)
            self.image.clear()
            return
        self.noteLabel.setText(summary_text(view))
        rows, dim = view.kept.shape
        self.image.setImage(render_channels(view.kept), autoLevels=False, levels=(0, 255))
        self.image.setRect(QRectF(0, 0, dim, rows))
        self._y_axis.labels = self._labels
        self._y_axis.heads = self._heads
        self.plot.setLimits(xMin=0, xMax=dim, yMin=0, yMax=rows)
        self.plot.setRange(xRange=(0, dim), yRange=(0, rows), padding=0)
        self._y_axis.picture = None
        self._y_axis.update()

    def view(self) -> ChannelView | None:
        return self._view

    def image_rgba(self) -> np.ndarray:
        """What is drawn, one cell per (row, channel)."""
        return np.zeros((0, 0, 4), np.uint8) if self._view is None else render_channels(self._view.kept)

    def export_image(self, path: str | os.PathLike[str], width: int | None = None) -> None:
        """Write the map with its axes to PNG or SVG (by suffix), atomically."""
        export_graphics(self.graphics.ci, path, width)

    def info_at(self, row: int, channel: int) -> str:
        """Layer, kv-head and channel; stored or pruned; the head's stored count and the bytes it saves."""
        v = self._view
        layer, head = divmod(row, self._heads)
        parts = [f"Layer {layer}", f"kv-head {head}", f"key channel {channel}"]
        if layer not in v.pruned_layers:
            parts.append("stored (this layer's keys are stored whole)")
            return " · ".join(parts)
        parts.append("stored" if v.kept[row, channel] else "pruned")
        n_kept = int(v.kept[row].sum())
        parts.append(
            f"the head stores {n_kept} of {v.head_dim} channels for its {int(v.rows_stored[row]):,} kept rows, "
            f"saving {_bytes(int(v.bytes_saved[row]))}"
        )
        return " · ".join(parts)

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        cell = None
        if self._view is not None and self.plot.vb.sceneBoundingRect().contains(scene_pos):
            point = self.plot.vb.mapSceneToView(scene_pos)
            row, channel = math.floor(point.y()), math.floor(point.x())
            if 0 <= row < self._view.kept.shape[0] and 0 <= channel < self._view.head_dim:
                cell = (row, channel)
        if cell == self._last:
            return
        self._last = cell
        text = "" if cell is None else self.info_at(*cell)
        self.hoverLabel.show_text(self.graphics, text)
        self.hoverInfo.emit(text)


def summary_text(view: ChannelView) -> str:
    """'ThinK stores 32 of 64 key channels per kv-head in layers 0–7: 12.0 KiB of key memory saved (50 % of those
    heads' keys).'"""
    pruned = [r for r in range(view.kept.shape[0]) if not view.kept[r].all()]
    kept_counts = sorted({int(view.kept[r].sum()) for r in pruned}) or [view.head_dim]
    counts = str(kept_counts[0]) if len(kept_counts) == 1 else f"{kept_counts[0]}–{kept_counts[-1]}"
    layers = view.pruned_layers
    where = f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}–{layers[-1]}"
    saved = int(view.bytes_saved.sum())
    rows = view.rows_stored.astype(np.float64)
    full = float((rows * view.head_dim).sum())
    share = float((rows * (view.head_dim - view.kept.sum(axis=1))).sum()) / full if full else 0.0
    return (
        f"ThinK stores {counts} of {view.head_dim} key channels per kv-head in {where}: "
        f"{_bytes(saved)} of key memory saved ({100 * share:.0f} % of those heads' keys)."
    )
