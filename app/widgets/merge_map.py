"""Merging's targets (issue 38), for one layer: as arcs (x = prompt position, one band per kv-head; each evicted
position whose value merging folded into a kept one is joined to it by an arc; kept positions orange,
evicted-and-merged blue, evicted-and-dropped dark) or as a matrix (a point at (evicted position, target position)
a merge, one colour a kv-head), so a user sees where every evicted position went; the hover names both tokens.

Fed plain arrays (app.engine.stored_view.merge_rows and the heatmap's kept mask); it never talks to the engine.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.widgets.heatmap import EVICTED_RGBA, KEPT_RGBA
from app.widgets.hover import HoverLine
from app.widgets.plot_export import export_graphics
from app.widgets.token_axis import TokenAxis, token_label

#: The line under the view when nothing is hovered (the hover text goes there and to the status bar).
HOVER_HINT = "Hover a position: where its value went, or which merged values it holds."
#: Said instead of the view when nothing was merged.
NO_MERGES = (
    "Nothing was merged: only merging (merging, merging-METHOD) folds each evicted value into a kept one; cam "
    "merges while decoding (Timeline dock)."
)
#: A dark Okabe–Ito blue: apart from the kept orange for the common colour-vision deficiencies, and dark enough
#: that the white arcs over it read.
MERGED_RGBA = (0, 84, 134, 255)
_ARC_PEN = pg.mkPen((235, 235, 235, 110), width=1)
_ARC_POINTS = 17
#: At most this many arcs drawn at once (those in view): a pan stays smooth at 32k positions.
MAX_ARCS = 20_000
DRAW_ARCS = "Arcs per kv-head"
DRAW_MATRIX = "Evicted × target"
#: Okabe–Ito colours, one a kv-head in the matrix (cycled past eight).
HEAD_RGB = (
    (230, 159, 0),
    (86, 180, 233),
    (0, 158, 115),
    (240, 228, 66),
    (0, 114, 178),
    (213, 94, 0),
    (204, 121, 167),
    (235, 235, 235),
)
#: The tallest arc reaches this share of its band above the band's centre line; an arc over _ARC_SPAN positions or
#: more is that tall, a shorter one lower (a merge to the next kept position stays visible when zoomed in).
_ARC_HEIGHT = 0.45
_ARC_SPAN = 48
_LEGEND = " &nbsp;".join(
    f'<span style="color: rgb{rgba[:3]}">■</span> {text}'
    for rgba, text in (
        (KEPT_RGBA, "kept"),
        (MERGED_RGBA, "evicted, merged (arc to its target)"),
        ((90, 90, 100), "evicted, dropped"),
    )
)


def render_merges(kept: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """[H, T] kept mask and targets (−1: none) -> [H, T, 4]: kept, evicted-and-merged, evicted-and-dropped."""
    idx = np.where(kept, 2, np.where(targets >= 0, 1, 0)).astype(np.uint8)
    return np.array([EVICTED_RGBA, MERGED_RGBA, KEPT_RGBA], dtype=np.uint8)[idx]


def arc_path(
    targets: np.ndarray, x_range: tuple[float, float] | None = None, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """x, y of the arcs (band h's centre at h + 0.5, arcs rising towards smaller y), NaN between arcs, for one
    PlotDataItem with connect="finite"; taller the farther a value travelled, up to _ARC_SPAN positions. Only the
    arcs that cross `x_range`, and at most `limit` of them (evenly spaced), so a long prompt's 100k merges do not
    stall a pan."""
    heads, sources = np.nonzero(targets >= 0)
    if x_range is not None and heads.size:
        ends = targets[heads, sources]
        seen = (np.maximum(sources, ends) + 1 >= x_range[0]) & (np.minimum(sources, ends) <= x_range[1])
        heads, sources = heads[seen], sources[seen]
    if limit is not None and heads.size > limit:
        pick = np.linspace(0, heads.size - 1, limit).astype(np.int64)
        heads, sources = heads[pick], sources[pick]
    if not heads.size:
        return np.zeros(0), np.zeros(0)
    ends = targets[heads, sources].astype(np.float64)
    s = np.linspace(0.0, 1.0, _ARC_POINTS)
    x = sources[:, None] + 0.5 + (ends - sources)[:, None] * s[None, :]
    height = _ARC_HEIGHT * np.sqrt(np.minimum(1.0, np.abs(ends - sources) / _ARC_SPAN))[:, None]
    y = heads[:, None] + 0.5 - height * 4 * s * (1 - s)
    nan = np.full((heads.size, 1), np.nan)
    return np.hstack([x, nan]).ravel(), np.hstack([y, nan]).ravel()


class MergeMap(QWidget):
    """A layer chooser, the one-line summary (or why there is nothing) and the arcs of the chosen layer."""

    hoverInfo = Signal(str)  # noqa: N815 (Qt signal naming)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("mergeMap")
        self._kept = np.zeros((0, 0), bool)
        self._targets: np.ndarray | None = None
        self._tokens: list[str] = []
        self._heads = 1
        self._last: tuple[int, int] | None = None
        self.noteLabel = QLabel(NO_MERGES, objectName="mergeMapNote")
        self.noteLabel.setWordWrap(True)
        self.layerCombo = QComboBox(objectName="mergeMapLayerCombo")
        self.layerCombo.setToolTip("The layer whose kv-heads are drawn, one band each")
        self.drawCombo = QComboBox(objectName="mergeMapDrawCombo")
        self.drawCombo.addItems([DRAW_ARCS, DRAW_MATRIX])
        self.drawCombo.setToolTip(
            "Arcs: one band a kv-head, an arc from each evicted position to its target (zoom in to read them). "
            "Evicted × target: a point a merge (x where it was, y where it went), one colour a kv-head"
        )
        self.legendLabel = QLabel(_LEGEND, objectName="mergeMapLegend")
        self.exportImageButton = QPushButton("Image…", objectName="mergeMapExportButton")
        self.exportImageButton.setToolTip("Save the merges of the shown layer as PNG or SVG")
        self.legendLabel.setWordWrap(True)
        self._x_axis = TokenAxis()
        self._y_axis = pg.AxisItem("left")
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setObjectName("mergeMapGraphics")
        self.plot = self.graphics.addPlot(
            row=0, col=0, axisItems={"bottom": self._x_axis, "left": self._y_axis}
        )
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.invertY(True)
        self.plot.setMouseEnabled(y=False)
        self.plot.setLabel("bottom", "position")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.arcs = pg.PlotDataItem(pen=_ARC_PEN, connect="finite")
        self.arcs.setZValue(5)
        self.plot.addItem(self.arcs)
        self.headPoints: list[pg.ScatterPlotItem] = []  # the matrix: one item a kv-head (one brush: fast)
        self.diagonal = pg.InfiniteLine(
            angle=45, movable=False, pen=pg.mkPen((150, 150, 150), style=Qt.PenStyle.DashLine)
        )
        self.plot.addItem(self.diagonal)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(QLabel("Layer"))
        top.addWidget(self.layerCombo)
        top.addWidget(self.drawCombo)
        top.addWidget(self.legendLabel, 1)
        top.addWidget(self.exportImageButton)
        self.controls = QWidget(objectName="mergeMapControls")
        self.controls.setLayout(top)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.setSpacing(2)
        layout.addWidget(self.noteLabel)
        layout.addWidget(self.controls)
        layout.addWidget(self.graphics, 1)
        self.hoverLabel = HoverLine(HOVER_HINT, "mergeMapHover")
        layout.addWidget(self.hoverLabel)
        self.layerCombo.currentIndexChanged.connect(self._redraw)
        self.drawCombo.currentIndexChanged.connect(self._redraw)
        self.plot.vb.sigXRangeChanged.connect(self._draw_arcs)
        self.graphics.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.set_data(None, np.zeros((0, 0), bool), [], 0, 1)

    def set_data(
        self,
        targets: np.ndarray | None,
        kept: np.ndarray,
        token_texts: list[str],
        n_layers: int,
        n_kv_heads: int,
    ) -> None:
        """Show merging's targets [L*H_kv, T] (−1: none) over the kept mask [L*H_kv, ≥T]; None: nothing merged."""
        self._targets = None if targets is None else np.asarray(targets)  # int32 from the engine: kept so
        self._heads = max(1, n_kv_heads)
        self._tokens = list(token_texts)
        self._last = None
        shown = self._targets is not None
        self.graphics.setVisible(shown)
        self.controls.setVisible(shown)
        self.hoverLabel.setVisible(shown)
        if not shown:
            self.noteLabel.setText(NO_MERGES)
            self._kept = np.zeros((0, 0), bool)
            self.image.clear()
            self.arcs.setData([], [])
            return
        length = self._targets.shape[1]
        self._kept = np.asarray(kept, dtype=bool)[:, :length]
        merged = (self._targets >= 0).reshape(n_layers, self._heads, length).sum(axis=(1, 2))
        self.noteLabel.setText(
            f"merging folded {int(merged.sum()):,} evicted values into kept positions ({n_layers} layers), each "
            "into the kept position whose key is most like its own."
        )
        current = self.layerCombo.currentIndex()
        self.layerCombo.blockSignals(True)
        self.layerCombo.clear()
        for layer in range(n_layers):
            self.layerCombo.addItem(f"Layer {layer} ({int(merged[layer])} merged)", layer)
        first = int(np.argmax(merged > 0)) if merged.any() else 0
        self.layerCombo.setCurrentIndex(current if 0 <= current < n_layers else first)
        self.layerCombo.blockSignals(False)
        self._redraw()

    def has_data(self) -> bool:
        """Whether merges are shown (a merging compression)."""
        return self._targets is not None

    def set_layer(self, layer: int) -> None:
        self.layerCombo.setCurrentIndex(layer)

    def layer(self) -> int:
        return max(0, self.layerCombo.currentIndex())

    def arc_pairs(self) -> list[tuple[int, int, int]]:
        """(kv-head, evicted position, target position) of every arc drawn for the shown layer."""
        t = self._layer_targets()
        if t is None:
            return []
        heads, sources = np.nonzero(t >= 0)
        return [(int(h), int(p), int(t[h, p])) for h, p in zip(heads, sources, strict=True)]

    def info_at(self, head: int, position: int) -> str:
        """The shown layer's kv-head `head` at `position`: its token, and where its value went or which merged
        values it holds."""
        layer = self.layer()
        t = self._layer_targets()
        row = layer * self._heads + head
        parts = [f"L{layer} h{head}", f"position {position} '{token_label(self._tokens[position], 30)}'"]
        target = int(t[head, position])
        if target >= 0:
            parts.append(
                f"evicted, merged into position {target} '{token_label(self._tokens[target], 30)}' "
                f"({abs(target - position)} positions {'later' if target > position else 'earlier'})"
            )
        elif self._kept[row, position]:
            sources = np.flatnonzero(t[head] == position)
            listed = ", ".join(str(p) for p in sources[:8]) + ("…" if sources.size > 8 else "")
            parts.append(
                f"kept; holds {sources.size} merged value{'s' if sources.size != 1 else ''}"
                + (f" (positions {listed})" if sources.size else "")
            )
        else:
            parts.append("evicted, not merged (below the similarity threshold or outside the merge fraction)")
        return " · ".join(parts)

    def export_image(self, path: str | os.PathLike[str], width: int | None = None) -> None:
        """Write the shown layer's merges (arcs or matrix) with their axes to PNG or SVG (by suffix), atomically."""
        export_graphics(self.graphics.ci, path, width)

    def _layer_targets(self) -> np.ndarray | None:
        if self._targets is None:
            return None
        layer = self.layer()
        return self._targets[layer * self._heads : (layer + 1) * self._heads]

    def matrix(self) -> bool:
        """Whether the evicted × target matrix is drawn (else the arcs)."""
        return self.drawCombo.currentText() == DRAW_MATRIX

    def set_matrix(self, on: bool) -> None:
        self.drawCombo.setCurrentText(DRAW_MATRIX if on else DRAW_ARCS)

    def _redraw(self, *_: object) -> None:
        t = self._layer_targets()
        if t is None:
            return
        layer = self.layer()
        kept = self._kept[layer * self._heads : (layer + 1) * self._heads]
        heads, length = t.shape
        matrix = self.matrix()
        for item in (self.image, self.arcs):
            item.setVisible(not matrix)
        self.diagonal.setVisible(matrix)
        for item in self.headPoints:
            item.setVisible(False)
        self.legendLabel.setText(_matrix_legend(heads) if matrix else _LEGEND)
        self._x_axis.tokens = self._tokens[:length]
        if matrix:
            for h in range(heads):
                src = np.flatnonzero(t[h] >= 0)
                item = self._head_points(h)
                item.setData(x=src + 0.5, y=t[h, src] + 0.5)
                item.setVisible(True)
            self.plot.invertY(False)
            self.plot.setMouseEnabled(x=True, y=True)
            self._y_axis.setTicks(None)
            self.plot.setLabel("left", "merged into position")
            self.plot.setLabel("bottom", "evicted position")
            self.plot.setLimits(xMin=0, xMax=length, yMin=0, yMax=length)
            self.plot.setRange(xRange=(0, length), yRange=(0, length), padding=0)
        else:
            self.image.setImage(render_merges(kept, t), autoLevels=False, levels=(0, 255))
            self.image.setRect(QRectF(0, 0, length, heads))
            self.plot.invertY(True)
            self.plot.setMouseEnabled(x=True, y=False)
            self._y_axis.setTicks([[(h + 0.5, f"h{h}") for h in range(heads)]])
            self.plot.setLabel("left", "")
            self.plot.setLabel("bottom", "position")
            self.plot.setLimits(xMin=0, xMax=length, yMin=0, yMax=heads)
            self.plot.setRange(xRange=(0, length), yRange=(0, heads), padding=0)
        self._draw_arcs()
        self._x_axis.picture = None
        self._x_axis.update()
        self._last = None

    def _head_points(self, h: int) -> pg.ScatterPlotItem:
        while len(self.headPoints) <= h:
            rgb = HEAD_RGB[len(self.headPoints) % len(HEAD_RGB)]
            item = pg.ScatterPlotItem(size=4, pen=None, brush=pg.mkBrush(*rgb, 200), pxMode=True)
            self.plot.addItem(item)
            self.headPoints.append(item)
        return self.headPoints[h]

    def point_count(self) -> int:
        """Points drawn in the matrix (one a merge of the shown layer); 0 while the arcs are shown."""
        return sum(len(p.data) for p in self.headPoints if p.isVisible()) if self.matrix() else 0

    def _draw_arcs(self, *_: object) -> None:
        """The arcs crossing the visible positions (none in the matrix)."""
        t = self._layer_targets()
        if t is None or self.matrix():
            self.arcs.setData([], [])
            return
        (x0, x1), _ = self.plot.vb.viewRange()
        self.arcs.setData(*arc_path(t, (x0, x1), MAX_ARCS))

    def _cell_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        """(kv-head, position) under the pointer: a band's cell, or in the matrix the merge at (x, y)."""
        t = self._layer_targets()
        if t is None or not self.plot.vb.sceneBoundingRect().contains(scene_pos):
            return None
        point = self.plot.vb.mapSceneToView(scene_pos)
        x, y = math.floor(point.x()), math.floor(point.y())
        if not 0 <= x < t.shape[1]:
            return None
        if self.matrix():
            heads = np.flatnonzero(t[:, x] == y)
            return (int(heads[0]), x) if heads.size else None
        return (y, x) if 0 <= y < t.shape[0] else None

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        cell = self._cell_at(scene_pos)
        if cell == self._last:
            return
        self._last = cell
        text = "" if cell is None else self.info_at(*cell)
        self.hoverLabel.show_text(self.graphics, text)
        self.hoverInfo.emit(text)


def _matrix_legend(heads: int) -> str:
    keys = " &nbsp;".join(
        f'<span style="color: rgb{HEAD_RGB[h % len(HEAD_RGB)]}">●</span> h{h}' for h in range(heads)
    )
    return f"{keys} &nbsp;a point a merge; on the dashed diagonal a value would stay where it was"
