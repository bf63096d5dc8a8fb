"""Retention heatmap: rows are (layer, kv-head), columns are token positions.

The RGBA image is built with NumPy LUT indexing and pushed with autoLevels=False. Only the visible columns are
drawn, binned so that one image column is one screen pixel (app.widgets.heatmap_bins: kept fraction, mean
score): a 36 layers x 8 kv-heads x 32k positions cache refreshes within a frame while a slider moves, and
zoomed in the cells are exact.
"""

from __future__ import annotations

import functools
import html
import math
import os

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.widgets.heatmap_bins import (
    bin_counts,
    bin_masked_means,
    bin_means,
    bin_sizes,
    bin_width,
    fraction_index,
)
from app.widgets.hover import show_hover
from app.widgets.plot_export import export_graphics
from app.widgets.row_axis import RowAxis
from app.widgets.token_axis import TokenAxis, token_label

VIEW_KEPT = "Kept"
VIEW_SCORES = "Scores"
VIEW_QUANT = "Quant error"
VIEW_DIFF = "Diff"
VIEWS = (VIEW_KEPT, VIEW_SCORES, VIEW_QUANT, VIEW_DIFF)

KEPT_RGBA = (255, 150, 20, 255)
#: The rings on the positions a question attends to (the hover marker's cyan).
MARK_RGBA = (0, 230, 255, 255)
EVICTED_RGBA = (24, 26, 34, 255)
#: Diff classes, indexed by 2·kept_now + kept_pinned (so the index is computed, never looked up).
DIFF_CLASSES = ("neither", "only pinned", "only current", "both")
#: Okabe–Ito blue and reddish purple for the two one-sided classes: apart from orange and from each other
#: for the common colour-vision deficiencies.
DIFF_RGBA = (EVICTED_RGBA, (204, 121, 167, 255), (86, 180, 233, 255), KEPT_RGBA)
#: A layer stored whole (sliding window, SSM state): grey where its steady-state window holds the position,
#: grey hatching elsewhere, so it never reads as a compression result.
FIXED_KEPT_RGBA = (150, 150, 156, 255)
FIXED_HATCH_RGBA = ((64, 64, 72, 255), (40, 40, 46, 255))
_FIXED_LABEL_RGBA = (230, 230, 230, 255)
_EVICTED_DIM = 0.22  # evicted cells in the scores view keep a faint trace of their score
_SCORE_MAP = "viridis"
_QUANT_MAP = "inferno"


@functools.lru_cache(maxsize=8)
def _lut(cmap_name: str) -> np.ndarray:
    """256 x 4 uint8 colours of a pyqtgraph colormap (built once per map)."""
    lut = pg.colormap.get(cmap_name).getLookupTable(nPts=256, alpha=True, mode="byte").astype(np.uint8)
    lut.flags.writeable = False
    return lut


def _apply(lut: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """(N, 4) uint8 colours indexed by `idx` -> idx.shape + (4,) uint8.

    One 4-byte take per cell instead of fancy-indexing rows of 4: 7-10x faster, which is what keeps a
    32 x 8 x 8k refresh inside one frame.
    """
    packed = np.ascontiguousarray(lut, dtype=np.uint8).view(np.uint32).ravel()
    return packed.take(idx).view(np.uint8).reshape(*idx.shape, 4)


def _to_index(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Map floats to 0..255 LUT indices (NaN and -inf go to 0)."""
    scale = 255.0 / (hi - lo) if hi > lo else 0.0
    idx = np.nan_to_num((values - lo) * scale, nan=0.0, posinf=255.0, neginf=0.0)
    return np.clip(idx, 0, 255, out=idx).astype(np.uint8)


def _finite_range(values: np.ndarray, mask: np.ndarray | None = None) -> tuple[float, float]:
    """Min and max of the finite entries (under `mask` if given); (0, 1) when there are none."""
    sel = values[mask] if mask is not None else values
    sel = sel[np.isfinite(sel)]
    if sel.size == 0:
        return 0.0, 1.0
    lo, hi = float(sel.min()), float(sel.max())
    return (lo, hi) if hi > lo else (lo, lo + 1.0)


def _fraction_lut() -> np.ndarray:
    """256 colours from evicted (none of a bin kept) to kept (all of it), endpoints exact."""
    t = np.linspace(0.0, 1.0, 256)[:, None]
    lut = np.rint(np.array(EVICTED_RGBA) * (1 - t) + np.array(KEPT_RGBA) * t).astype(np.uint8)
    lut[0], lut[-1] = EVICTED_RGBA, KEPT_RGBA
    return lut


_FRACTION_LUT = _fraction_lut()


def render_kept(kept: np.ndarray) -> np.ndarray:
    """(rows, T) bool -> (rows, T, 4) uint8: saturated colour for kept, near black for evicted."""
    lut = np.array([EVICTED_RGBA, KEPT_RGBA], dtype=np.uint8)
    return _apply(lut, kept.view(np.uint8))


def render_scores(kept: np.ndarray, scores: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Scores through a colormap; evicted cells dimmed, so the kept set still stands out."""
    base = _lut(_SCORE_MAP)
    dim = base.copy()
    dim[:, :3] = (base[:, :3] * _EVICTED_DIM + np.array(EVICTED_RGBA[:3]) * (1 - _EVICTED_DIM)).astype(
        np.uint8
    )
    lut = np.concatenate([dim, base])
    idx = _to_index(scores, lo, hi).astype(np.uint16)
    idx += kept.view(np.uint8).astype(np.uint16) << 8
    return _apply(lut, idx)


def render_quant(kept: np.ndarray, error: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Quantization error of the kept cells through a colormap; evicted cells (nothing stored) dark."""
    lut = np.concatenate([_lut(_QUANT_MAP), np.array([EVICTED_RGBA], dtype=np.uint8)])
    idx = _to_index(error, lo, hi).astype(np.uint16)
    idx[~kept] = 256
    return _apply(lut, idx)


def paint_fixed_rows(rgba: np.ndarray, kept: np.ndarray, rows: np.ndarray) -> None:
    """Overwrite `rows` of an (rows, T, 4) image in place: FIXED_KEPT_RGBA where kept, diagonal hatching
    (stripes two cells wide) elsewhere."""
    if rows.size == 0:
        return
    lut = np.array([*FIXED_HATCH_RGBA, FIXED_KEPT_RGBA], dtype=np.uint8)
    stripe = ((rows[:, None] + np.arange(kept.shape[1])[None, :]) // 2) % 2
    idx = np.where(kept[rows], 2, stripe).astype(np.uint8)
    rgba[rows] = _apply(lut, idx)


def _swatch(rgba: tuple[int, ...]) -> tuple[int, ...]:
    """A legend square's colour: the cell colour, lifted when it is too dark to see on a dark label."""
    return (90, 90, 100) if rgba == EVICTED_RGBA else rgba[:3]


def diff_classes(current: np.ndarray, pinned: np.ndarray) -> np.ndarray:
    """(rows, T) class index per cell: 0 neither, 1 only pinned, 2 only current, 3 both (see DIFF_CLASSES)."""
    return (current.view(np.uint8) << 1) | pinned.view(np.uint8)


def diff_counts(current: np.ndarray, pinned: np.ndarray) -> np.ndarray:
    """(rows, 4) cells of each DIFF_CLASSES class per row of two (rows, T) kept masks."""
    cls = diff_classes(np.ascontiguousarray(current), np.ascontiguousarray(pinned))
    return np.stack([(cls == k).sum(axis=1) for k in range(len(DIFF_CLASSES))], axis=1)


def render_diff(current: np.ndarray, pinned: np.ndarray) -> np.ndarray:
    """(rows, T) current and pinned kept masks -> (rows, T, 4) uint8 in the DIFF_RGBA colours."""
    return _apply(np.array(DIFF_RGBA, dtype=np.uint8), diff_classes(current, pinned))


_KEPT_LEGEND = (
    f'<span style="color: rgb{KEPT_RGBA[:3]}">■</span> kept &nbsp;'
    f'<span style="color: rgb{_swatch(EVICTED_RGBA)}">■</span> evicted'
)
#: Legend and hover order: what both keep first, then the differences, then what neither keeps.
_LEGEND_ORDER = tuple((k, DIFF_CLASSES[k]) for k in (3, 2, 1, 0))


class RetentionHeatmap(QWidget):
    """Kept/evicted map of the compressed KV cache with score and quantization-error views.

    Feed it plain NumPy arrays through `set_data`; it never talks to the engine.
    """

    hoverInfo = Signal(str)  # noqa: N815 (Qt signal naming)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("heatmapView")
        self._kept = np.zeros((0, 0), dtype=bool)
        self._scores: np.ndarray | None = None
        self._quant: np.ndarray | None = None
        self._pinned: np.ndarray | None = None  # [rows, T] kept mask of the pinned configuration (B)
        self._pinned_label = ""
        self._labels: list[str] = []
        self._tokens: list[str] = []
        self._n_layers = 0
        self._heads = 1
        self._row_offset = 0
        self._rgba = np.zeros((0, 0, 4), dtype=np.uint8)
        self._shown_shape: tuple[int, int] | None = None
        self._window_shown: tuple | None = None  # (first row, first column, end column, bin width) drawn
        self._fitting = False
        self._last_cell: tuple[int, int] | None = None
        self._fixed: dict[int, str] = {}  # layer stored whole -> its label
        self._fixed_items: list[pg.TextItem] = []
        self._marks: np.ndarray | None = None  # [rows, T_marked] bool: cells ringed (a question's attention)
        self._marks_label = ""
        self._merges: np.ndarray | None = (
            None  # [rows, T'] merging's target of each evicted position, −1 none
        )
        self.title: str | None = None
        self._build_ui()

    def _build_ui(self) -> None:
        self.viewCombo = QComboBox(objectName="heatmapModeCombo")
        self.viewCombo.addItems(list(VIEWS))
        self.viewCombo.setToolTip(
            "What the colour shows: kept/evicted, the method's scores, quantization error, "
            "or the difference to the pinned configuration"
        )
        self.layerCombo = QComboBox(objectName="heatmapLayerCombo")
        self.layerCombo.addItem("All layers", None)
        self.layerCombo.setToolTip("Show every layer, or one layer's kv-heads large")
        self.legendLabel = QLabel(_KEPT_LEGEND, objectName="heatmapLegend")
        self.legendLabel.setWordWrap(True)  # the Diff view's counts wrap rather than widening the window
        self.marksLegend = QLabel(
            f'<span style="color: rgb{MARK_RGBA[:3]}">◯</span> most attended by the question',
            objectName="heatmapMarksLegend",
        )
        self.marksLegend.setVisible(False)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        for w in (
            QLabel("View"),
            self.viewCombo,
            QLabel("Layer"),
            self.layerCombo,
            self.legendLabel,
            self.marksLegend,
        ):
            top.addWidget(w)
        top.setStretchFactor(self.legendLabel, 1)

        self._x_axis, self._y_axis = TokenAxis(), RowAxis()
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setObjectName("heatmapGraphics")
        self.plot = self.graphics.addPlot(
            row=0, col=0, axisItems={"bottom": self._x_axis, "left": self._y_axis}
        )
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.invertY(True)
        self.plot.setLabel("bottom", "position")
        self.image = pg.ImageItem(axisOrder="row-major", autoDownsample=True)
        self.plot.addItem(self.image)
        self.marker = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen((0, 230, 255), width=2))
        self.marker.setZValue(10)
        self.marker.setVisible(False)
        self.plot.addItem(self.marker)
        self.boundary = pg.InfiniteLine(
            angle=90, movable=False, pen=pg.mkPen((235, 235, 235), width=1, style=Qt.PenStyle.DashLine)
        )
        self.boundary.setZValue(9)
        self.boundary.setVisible(False)
        self.boundary_column: int | None = None
        self.plot.addItem(self.boundary)
        self.marksItem = pg.ScatterPlotItem(
            symbol="o", size=7, pen=pg.mkPen(MARK_RGBA, width=1.5), brush=None, pxMode=True
        )
        self.marksItem.setZValue(11)
        self.plot.addItem(self.marksItem)
        self.colorBar = pg.ColorBarItem(values=(0, 1), interactive=False, colorMapMenu=False, width=15)
        self.colorBar.axis.enableAutoSIPrefix(False)  # quantization error reads 0.003, not 3 "(x0.001)"
        self.graphics.addItem(self.colorBar, row=0, col=1)
        self.colorBar.setVisible(False)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.graphics, 1)

        self.viewCombo.currentIndexChanged.connect(self._refresh)
        self.layerCombo.currentIndexChanged.connect(self._refresh)
        self.plot.vb.sigXRangeChanged.connect(self._on_range_changed)
        self.plot.vb.sigResized.connect(self._on_range_changed)
        self.graphics.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self._update_view_availability()

    # -- public API -------------------------------------------------------------------------------

    def set_data(
        self,
        kept: np.ndarray,
        row_labels: list[str],
        token_texts: list[str],
        scores: np.ndarray | None,
        quant_error: np.ndarray | None,
        n_layers: int,
        n_kv_heads: int,
        not_compressible: dict[int, str] | None = None,
    ) -> None:
        """Show a new compression result. Zoom is kept when the shape is unchanged, so moving a
        slider does not throw away where the user was looking. `not_compressible` maps layers stored whole
        (sliding window, SSM state) to a label such as "sliding window 32: not compressible"; their rows are
        drawn grey (hatched where the window does not hold the position) with the label on them."""
        kept = np.ascontiguousarray(kept, dtype=bool)
        if kept.ndim != 2:
            raise ValueError(f"kept must be 2-D (rows, T), got shape {kept.shape}")
        rows, length = kept.shape
        if n_layers * n_kv_heads != rows or len(row_labels) != rows or len(token_texts) != length:
            raise ValueError(
                f"kept {kept.shape} does not match {n_layers} layers x {n_kv_heads} kv-heads, "
                f"{len(row_labels)} row labels and {len(token_texts)} tokens"
            )
        for name, arr in (("scores", scores), ("quant_error", quant_error)):
            if arr is not None and np.shape(arr) != kept.shape:
                raise ValueError(f"{name} has shape {np.shape(arr)}, expected {kept.shape}")
        self.set_title(None)
        self._merges = self._channels = (
            None  # they belong to one compression: show_compression sets them again
        )
        self._kept = kept
        self._scores = None if scores is None else np.asarray(scores, dtype=np.float32)
        self._quant = None if quant_error is None else np.asarray(quant_error, dtype=np.float32)
        self._labels, self._tokens = list(row_labels), list(token_texts)
        self._heads = max(1, n_kv_heads)
        self._fixed = {int(k): v for k, v in (not_compressible or {}).items() if 0 <= int(k) < n_layers}
        self._x_axis.tokens = self._tokens
        if n_layers != self._n_layers:
            self._n_layers = n_layers
            self._rebuild_layer_combo()
        self._update_view_availability()
        self._refresh()

    def set_pinned(self, kept: np.ndarray | None, label: str = "") -> None:
        """Pin kept mask B, [rows, T_B] over its compressible prompt positions (None: unpin). The Diff view
        compares every later set_data against it; columns right of T_B are stored by B (its always-stored
        tail), so a pin taken under another schedule compares position by position."""
        self._pinned = None if kept is None else np.ascontiguousarray(kept, dtype=bool)
        self._pinned_label = label if kept is not None else ""
        self._update_view_availability()
        self._refresh()

    def set_marks(self, marked: np.ndarray | None, label: str = "") -> None:
        """Ring the cells of `marked` [rows, T'] (T' may stop short of the shown columns: a question's attention
        covers the context only); None clears. Rows that do not match the data shown are refused."""
        if marked is not None:
            marked = np.ascontiguousarray(marked, dtype=bool)
            if marked.ndim != 2 or marked.shape[0] != self._kept.shape[0]:
                raise ValueError(
                    f"marks {marked.shape} do not match the heatmap's {self._kept.shape[0]} rows"
                )
        self._marks, self._marks_label = marked, label if marked is not None else ""
        self._draw_marks(self._visible_rows())

    def set_merge_targets(self, targets: np.ndarray | None) -> None:
        """Merging's target of every evicted position, [rows, T'] (−1: kept or not merged; T' the compressed
        prompt positions), for the hover; None clears. Rows that do not match the data shown are refused."""
        if targets is not None:
            targets = np.asarray(targets, dtype=np.int64)
            if targets.ndim != 2 or targets.shape[0] != self._kept.shape[0]:
                raise ValueError(
                    f"merge targets {targets.shape} do not match the heatmap's {self._kept.shape[0]} rows"
                )
        self._merges = targets

    def set_key_channels(self, stored: np.ndarray | None, head_dim: int = 0) -> None:
        """ThinK's stored key channels per row ([rows] counts of `head_dim`), for the hover of kept cells; None
        clears. Rows that do not match the data shown are refused."""
        if stored is not None:
            stored = np.asarray(stored, dtype=np.int64)
            if stored.shape != (self._kept.shape[0],):
                raise ValueError(
                    f"key channels {stored.shape} do not match the heatmap's {self._kept.shape[0]} rows"
                )
        self._channels = None if stored is None else (stored, int(head_dim))

    def merge_info(self, row: int, position: int) -> str | None:
        """Where merging put data row `row`'s position: "merged into position N (token 'x')" for an evicted one,
        "holds k merged values (positions …)" for a kept target; None when nothing was merged there."""
        m = self._merges
        if m is None or not 0 <= position < m.shape[1]:
            return None
        target = int(m[row, position])
        if target >= 0:
            return f"merged into position {target} (token '{token_label(self._tokens[target], 20)}')"
        sources = np.flatnonzero(m[row] == position)
        if not sources.size:
            return "not merged" if not self._kept[row, position] else None
        shown = ", ".join(str(p) for p in sources[:6]) + ("…" if sources.size > 6 else "")
        plural = "s" if sources.size != 1 else ""
        return f"holds {sources.size} merged value{plural} (position{plural} {shown})"

    def marks(self) -> np.ndarray | None:
        """The ringed cells [rows, T'], or None."""
        return None if self._marks is None else self._marks.copy()

    def marked_cells(self) -> list[tuple[int, int]]:
        """(shown row, position) of every ring drawn now (the visible rows, positions inside the data)."""
        x, y = self.marksItem.getData()
        return [(int(r), int(c)) for c, r in zip(np.floor(x), np.floor(y), strict=True)]

    def _draw_marks(self, rows: slice) -> None:
        shown = self._marks is not None and self._marks.shape[0] == self._kept.shape[0]
        self.marksLegend.setVisible(shown)
        self.marksLegend.setToolTip(self._marks_label)
        if not shown:
            self.marksItem.setData(x=[], y=[])
            return
        width = min(self._marks.shape[1], self._kept.shape[1])
        r, c = np.nonzero(self._marks[rows, :width])
        self.marksItem.setData(x=c + 0.5, y=r + 0.5)
        self.marksItem.setToolTip(self._marks_label)

    def pinned(self) -> np.ndarray | None:
        """The pinned kept mask, or None."""
        return None if self._pinned is None else self._pinned.copy()

    def diff_counts(self) -> np.ndarray:
        """(rows, 4) per (layer, kv-head) row, over the positions either configuration could evict: cells in
        each DIFF_CLASSES class (neither, only pinned, only current, both); empty when nothing is pinned."""
        if not self._diff_possible():
            return np.zeros((0, len(DIFF_CLASSES)), dtype=np.int64)
        return self._row_counts(slice(0, self._kept.shape[0]))

    def clear(self) -> None:
        """Show nothing (e.g. after loading another model)."""
        self.set_boundary(None)
        self.highlight_position(None)
        self._marks = None
        self.set_data(np.zeros((0, 0), dtype=bool), [], [], None, None, 0, 0)

    def set_title(self, text: str | None) -> None:
        """A line above the map saying what it shows when that is not the compression result (a decode step of
        the Timeline); set_data clears it."""
        self.plot.setTitle(text, size="9pt")
        self.title = text

    def set_view(self, name: str) -> None:
        """Switch to one of VIEWS."""
        self.viewCombo.setCurrentIndex(VIEWS.index(name))

    def view(self) -> str:
        """The current view name."""
        return self.viewCombo.currentText()

    def set_layer(self, layer: int | None) -> None:
        """Show one layer's heads (None: all layers)."""
        self.layerCombo.setCurrentIndex(0 if layer is None else layer + 1)

    def layer(self) -> int | None:
        """The selected layer, or None for all layers."""
        return self.layerCombo.currentData()

    def highlight_position(self, pos: int | None) -> None:
        """Draw a vertical marker on column `pos` (None or negative hides it)."""
        if pos is None or pos < 0:
            self.marker.setVisible(False)
            return
        self.marker.setPos(pos + 0.5)
        self.marker.setVisible(True)

    def set_boundary(self, column: int | None, prompt_len: int | None = None) -> None:
        """Mark where the compressible prompt ends and the always-stored tail begins (under the "mlx-lm"
        schedule the last prompt token, then the generated tokens); None hides the line."""
        self.boundary.setVisible(column is not None)
        self.boundary_column = column
        if column is not None:
            self.boundary.setPos(column)
            held = prompt_len is not None and column < prompt_len
            self.boundary.setToolTip(
                "Right of this line: "
                + ("the last prompt token and " if held else "")
                + "the generated tokens, always kept"
            )
        if self.view() == VIEW_DIFF and self._diff_possible():
            self.legendLabel.setText(self._diff_legend())  # its totals run up to the boundary

    def _compressed_columns(self) -> int:
        """The first always-stored column (the end of the compressed prompt positions), or every column."""
        return self._kept.shape[1] if self.boundary_column is None else self.boundary_column

    def image_rgba(self) -> np.ndarray:
        """The shown rows at one image column per position, shape (rows shown, T, 4): what the display shows
        zoomed in (zoomed out, it shows bins of this; see `displayed_window`)."""
        rows = self._visible_rows()
        if self._kept[rows].size == 0:
            return np.zeros((0, 0, 4), dtype=np.uint8)
        return self._render_window(rows, 0, self._kept.shape[1], 1)[0]

    def displayed_window(self) -> tuple[int, int, int] | None:
        """(first column, end column, positions per image column) of the image on screen; None when empty."""
        return None if self._window_shown is None else self._window_shown[1:4]

    def info_at(self, row: int, position: int) -> str:
        """Describe displayed cell (row, position): layer, kv-head, position, token, score, kept."""
        r = row + self._row_offset
        parts = [
            f"Layer {r // self._heads}",
            f"kv-head {r % self._heads}",
            f"position {position}",
            f"token '{token_label(self._tokens[position], 40)}'",
        ]
        if self._scores is not None:
            parts.append(f"score {self._scores[r, position]:.4g}")
        if self._quant is not None and self._kept[r, position]:
            parts.append(f"quant error {self._quant[r, position]:.4g}")
        if self.view() == VIEW_DIFF and self._diff_possible():
            parts.append(self._diff_info(r, position))
        elif r // self._heads in self._fixed:
            where = "in the window" if self._kept[r, position] else "outside the window"
            parts.append(f"{where} ({self._fixed[r // self._heads]})")
        else:
            parts.append("kept" if self._kept[r, position] else "evicted")
            merged = self.merge_info(r, position)
            if merged:
                parts.append(merged)
            if (
                self._channels is not None
                and self._kept[r, position]
                and position < self._compressed_columns()
            ):
                stored, dim = self._channels
                if stored[r] < dim:
                    parts.append(f"key stored in {stored[r]} of {dim} channels (ThinK)")
        marks = self._marks
        shown = marks is not None and marks.shape[0] == self._kept.shape[0] and position < marks.shape[1]
        if shown and marks[r, position]:
            parts.append("◯ " + self._marks_label)
        return " · ".join(parts)

    def fixed_rows(self) -> np.ndarray:
        """Indices of the displayed rows that belong to layers stored whole."""
        layers = np.array(sorted(self._fixed), dtype=np.int64)
        rows = (layers[:, None] * self._heads + np.arange(self._heads)[None, :]).ravel() - self._row_offset
        return rows[(rows >= 0) & (rows < self._n_shown_rows())]

    def _n_shown_rows(self) -> int:
        rows = self._visible_rows()
        return len(range(*rows.indices(self._kept.shape[0])))

    def fixed_labels(self) -> list[str]:
        """The labels drawn on the displayed not-compressible layers."""
        return [item.textItem.toPlainText() for item in self._fixed_items]

    def export_image(self, path: str | os.PathLike[str], width: int | None = None) -> None:
        """Write the heatmap with its axes and colour bar to PNG or SVG (by suffix), atomically."""
        export_graphics(self.graphics.ci, path, width)

    def _diff_info(self, row: int, position: int) -> str:
        """The cell's class and the row's class counts over the positions either could evict."""
        counts = self._row_counts(slice(row, row + 1))[0]
        row_text = "row: " + ", ".join(f"{name} {counts[k]}" for k, name in _LEGEND_ORDER)
        if position >= self._diff_width():
            return f"both (always stored) · {row_text}"
        pinned = self._pinned_columns(slice(row, row + 1))[0, position]
        cls = (int(self._kept[row, position]) << 1) | int(pinned)
        return f"{DIFF_CLASSES[cls]} · {row_text}"

    # -- internals --------------------------------------------------------------------------------

    def _rebuild_layer_combo(self) -> None:
        current = self.layerCombo.currentData()
        self.layerCombo.blockSignals(True)
        self.layerCombo.clear()
        self.layerCombo.addItem("All layers", None)
        for layer in range(self._n_layers):
            self.layerCombo.addItem(f"Layer {layer}", layer)
        if current is not None and current < self._n_layers:
            self.layerCombo.setCurrentIndex(current + 1)
        self.layerCombo.blockSignals(False)

    def _update_view_availability(self) -> None:
        model = self.viewCombo.model()
        reasons = {
            VIEW_SCORES: None if self._scores is not None else "This method gives no scores",
            VIEW_QUANT: None
            if self._quant is not None
            else "No quantization error: the cache is not quantized",
            VIEW_DIFF: None if self._diff_possible() else "Nothing pinned: Pin a configuration first",
        }
        for i, name in enumerate(VIEWS):
            reason = reasons.get(name)
            item = model.item(i)
            item.setEnabled(reason is None)
            item.setToolTip(reason or "")
            if reason and self.viewCombo.currentIndex() == i:
                self.viewCombo.blockSignals(True)
                self.viewCombo.setCurrentIndex(0)
                self.viewCombo.blockSignals(False)

    def _visible_rows(self) -> slice:
        layer = self.layerCombo.currentData()
        if layer is None:
            return slice(0, self._kept.shape[0])
        return slice(layer * self._heads, (layer + 1) * self._heads)

    def _refresh(self) -> None:
        rows = self._visible_rows()
        self._row_offset = rows.start
        self._y_axis.labels = self._labels[rows]
        self._y_axis.heads = self._heads
        self._y_axis.layer_offset = rows.start // self._heads
        self._fit_range()
        self._render(force=True)
        self._draw_fixed_labels(rows)
        self._draw_marks(rows)
        self._x_axis.picture = None
        self._y_axis.picture = None
        self._x_axis.update()
        self._y_axis.update()
        view = self.viewCombo.currentText()
        diff = view == VIEW_DIFF and self._diff_possible()
        self.legendLabel.setText(self._diff_legend() if diff else _KEPT_LEGEND)

    def _fit_range(self) -> None:
        """Show everything when the shape of the shown data changed; keep the zoom otherwise."""
        shape = (self._n_shown_rows(), self._kept.shape[1])
        if shape == self._shown_shape:
            return
        self._shown_shape = shape
        if 0 in shape:
            return
        rows, length = shape
        self._fitting = True
        try:
            self.plot.setLimits(xMin=0, xMax=length, yMin=0, yMax=rows)
            self.plot.setRange(xRange=(0, length), yRange=(0, rows), padding=0)
        finally:
            self._fitting = False

    def _window(self) -> tuple[int, int, int]:
        """(first column, end column, bin width) covering the visible x range at one bin per screen pixel."""
        length = self._kept.shape[1]
        (x0, x1), _ = self.plot.vb.viewRange()
        lo, hi = max(0, math.floor(x0)), min(length, math.ceil(x1))
        if hi <= lo:
            lo, hi = 0, length
        pixels = self.plot.vb.width() * self.graphics.devicePixelRatioF()
        width = bin_width(hi - lo, pixels if pixels >= 2 else 1024)
        first = (lo // width) * width
        return first, min(length, -(-hi // width) * width), width

    def _on_range_changed(self, *_: object) -> None:
        if not self._fitting:
            self._render(force=False)

    def _render(self, force: bool) -> None:
        """Draw the visible window (again only if it moved, when not forced)."""
        rows = self._visible_rows()
        if self._kept[rows].size == 0:
            self.image.clear()
            self._rgba = np.zeros((0, 0, 4), dtype=np.uint8)
            self._window_shown = None
            self._show_colour_bar(None)
            self.legendLabel.setVisible(True)
            return
        first, end, width = self._window()
        key = (rows.start, first, end, width)
        if not force and key == self._window_shown:
            return
        rgba, bar = self._render_window(rows, first, end, width)
        self._rgba, self._window_shown = rgba, key
        self.image.setImage(rgba, autoLevels=False, levels=(0, 255))
        self.image.setRect(QRectF(first, 0, rgba.shape[1] * width, rgba.shape[0]))
        self._show_colour_bar(bar)
        self.legendLabel.setVisible(bar is None)

    def _render_window(
        self, rows: slice, first: int, end: int, width: int
    ) -> tuple[np.ndarray, tuple[str, float, float, str] | None]:
        """RGBA of `rows` x columns first..end in bins of `width` positions, and the colour bar it needs."""
        kept = self._kept[rows, first:end]
        counts = bin_counts(kept, width)
        n = end - first
        major = counts.astype(np.int64) * 2 >= bin_sizes(n, width)[None, :]  # most of the bin is kept
        view = self.viewCombo.currentText()
        bar = None
        if view == VIEW_SCORES and self._scores is not None:
            scores = bin_means(self._scores[rows, first:end], width)
            lo, hi = _finite_range(scores)
            rgba, bar = render_scores(major, scores, lo, hi), (_SCORE_MAP, lo, hi, "score")
        elif view == VIEW_QUANT and self._quant is not None:
            err = bin_masked_means(self._quant[rows, first:end], kept, counts, width)
            lo, hi = _finite_range(err)
            rgba, bar = render_quant(counts > 0, err, lo, hi), (_QUANT_MAP, lo, hi, "quant error")
        elif view == VIEW_DIFF and self._diff_possible():
            pinned = bin_counts(self._pinned_columns(rows)[:, first:end], width)
            pinned_major = pinned.astype(np.int64) * 2 >= bin_sizes(n, width)[None, :]
            rgba = render_diff(major, pinned_major)
        else:
            rgba = _apply(_FRACTION_LUT, fraction_index(counts, width, n))
        if self._fixed:
            paint_fixed_rows(rgba, major, self.fixed_rows())
        return rgba, bar

    def _draw_fixed_labels(self, rows: slice) -> None:
        """Put the label of each displayed layer stored whole on its rows."""
        for item in self._fixed_items:
            self.plot.removeItem(item)
        self._fixed_items = []
        shown = self._n_shown_rows()
        for layer, label in sorted(self._fixed.items()):
            top = layer * self._heads - rows.start
            if top < 0 or top >= shown:
                continue
            item = pg.TextItem(label, color=_FIXED_LABEL_RGBA, anchor=(0, 0.5))
            item.setPos(0, top + self._heads / 2)
            item.setZValue(8)
            self.plot.addItem(item)
            self._fixed_items.append(item)

    def _diff_possible(self) -> bool:
        p = self._pinned
        return p is not None and p.shape[0] == self._kept.shape[0] and p.shape[1] <= self._kept.shape[1]

    def _pinned_columns(self, rows: slice) -> np.ndarray:
        """The pinned mask of `rows`, widened to the shown columns: the always-stored tail is in both."""
        shown = np.ones((self._kept[rows].shape[0], self._kept.shape[1]), dtype=bool)
        shown[:, : self._pinned.shape[1]] = self._pinned[rows]
        return shown

    def _diff_width(self) -> int:
        """Columns either configuration could evict: its own compressible prompt positions, whichever is longer
        (the schedules differ by the last prompt token)."""
        return min(self._kept.shape[1], max(self._pinned.shape[1], self.boundary_column or 0))

    def _row_counts(self, rows: slice) -> np.ndarray:
        width = self._diff_width()
        return diff_counts(self._kept[rows, :width], self._pinned_columns(rows)[:, :width])

    def _diff_legend(self) -> str:
        """Colour key with the totals over every (layer, kv-head) and position either could evict."""
        totals = self._row_counts(slice(0, self._kept.shape[0])).sum(axis=0)
        keys = " &nbsp;".join(
            f'<span style="color: rgb{_swatch(DIFF_RGBA[k])}">■</span> {name} {totals[k]:,}'
            for k, name in _LEGEND_ORDER
        )
        return f"{keys} &nbsp;<i>(pinned: {html.escape(self._pinned_label)})</i>"

    def _show_colour_bar(self, bar: tuple[str, float, float, str] | None) -> None:
        self.colorBar.setVisible(bar is not None)
        if bar is None:
            return
        cmap_name, lo, hi, label = bar
        self.colorBar.setColorMap(pg.colormap.get(cmap_name))
        self.colorBar.setLevels(values=(lo, hi))
        self.colorBar.axis.setLabel(label)

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        cell = self._cell_at(scene_pos)
        if cell == self._last_cell:
            return
        self._last_cell = cell
        if cell is None:
            self.graphics.setToolTip("")
            self.hoverInfo.emit("")
            return
        text = self.info_at(*cell)
        show_hover(self.graphics, text)
        self.hoverInfo.emit(text)

    def _cell_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        if self._window_shown is None or not self.plot.vb.sceneBoundingRect().contains(scene_pos):
            return None
        point = self.plot.vb.mapSceneToView(scene_pos)
        row, col = math.floor(point.y()), math.floor(point.x())
        rows, length = self._n_shown_rows(), self._kept.shape[1]
        if 0 <= row < rows and 0 <= col < length:
            return row, col
        return None
