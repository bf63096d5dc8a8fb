"""The memory–quality frontier of a sweep: bytes on x, a chosen metric on y, one colour and marker per method.

Each method's points are joined through its ratios (one line per bit width, dashed when quantized); the Pareto
frontier over all points (kvcore.measure.frontier) is drawn on top and listed beside the plot. Hovering a point says
its configuration and metrics; clicking one emits `pointClicked` with its index so the window can apply it.
The points may also be a prompt-set results file's (kvcore.sets.results_file.ResultPoint): one per configuration at
its mean, with its interval as an error bar, on % of dense only (the file has no absolute bytes).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.widgets.axes import ScientificAxis
from app.widgets.config_text import config_label
from app.widgets.plot_export import export_graphics
from kvcore.defaults import UNQUANTIZED_BITS
from kvcore.engine.sweep import SweepPoint
from kvcore.measure.frontier import DEFAULT_METRIC, METRICS, metric_value, pareto_front
from kvcore.sets.results_file import ResultPoint
from kvcore.sets.summary import few_prompts_note

#: What the plot draws: one prompt's sweep, or a prompt-set results file.
Point = SweepPoint | ResultPoint

#: A KL of exactly 0 (the dense cache, or a "full" method) drawn at this height on the log axis.
LOG_FLOOR = 1e-6
#: How close (in screen pixels) the pointer must come to a point for hover and click.
HIT_PIXELS = 12
X_PERCENT, X_BYTES = "percent", "bytes"
SYMBOLS = ("o", "s", "t", "d", "star", "p", "h", "t1", "+", "x", "t2", "t3")
PALETTE = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)
FRONTIER_PEN = pg.mkPen((20, 20, 20), width=2, style=Qt.PenStyle.DashLine)
ERROR_BAR_PEN = pg.mkPen((60, 60, 60), width=1.2)
#: On screen the y axis says the metric in short (the combo above names it in full); an export says it in full.
_SHORT_LABELS = {
    "kl_mean": "KL, mean per token",
    "agreement": "top-1 agreement",
    "nll_delta": "NLL Δ (nats/token)",
    "first_divergence": "first divergence",
    "needle_recall": "needle recall",
    "question_accuracy": "question accuracy",
}
#: Metrics offered only when some point has them (a needle grid's recall, a sweep over questions).
_OPTIONAL_METRICS = ("needle_recall", "question_accuracy")
_RESULT_NAMES = {"kl_mean": "KL", "agreement": "agreement", "nll_delta": "NLL Δ", "needle_recall": "recall"}


def point_text(point: Point, baseline: str | None = None) -> str:
    """A point's configuration and metrics in one line (hover, frontier list); `baseline` is the dense cache's
    element type of the sweep's model, which names an unquantized configuration (a results file's is not known)."""
    if isinstance(point, ResultPoint):
        return result_text(point)
    m = point.metrics
    parts = [
        config_label(point.config.to_dict(), baseline),
        f"{point.percent_of_dense:.1f} % of dense ({_kib(point)})",
    ]
    for key, name in (("kl_mean", "KL"), ("agreement", "agreement"), ("nll_delta", "NLL Δ")):
        value = m.get(key)
        if value is not None:
            parts.append(f"{name} {value:.4g}")
    first = m.get("first_divergence")
    parts.append(f"first divergence {'none' if first is None else first}")
    if m.get("needle_recall") is not None:
        parts.append(f"needle recall {m['needle_recall']:.2f}")
    if m.get("question_accuracy") is not None:
        parts.append(f"question accuracy {m['question_accuracy']:.2f}")
    return " · ".join(parts)


def result_text(point: ResultPoint) -> str:
    """A results file's configuration: prompts, memory and each metric's mean [interval]."""
    mean, low, high = (100 * v for v in point.memory)
    parts = [
        config_label(point.config.to_dict()),
        f"{point.prompts} prompt{'s' if point.prompts != 1 else ''}",
        f"{mean:.1f} % of dense" + (f" [{low:.1f}, {high:.1f}]" if point.intervals else ""),
    ]
    for key, name in _RESULT_NAMES.items():
        value = point.metrics.get(key)
        if value is not None:
            interval = point.intervals.get(key)
            bounds = "" if interval is None else f" [{interval[0]:.4g}, {interval[1]:.4g}]"
            parts.append(f"{name} {value:.4g}{bounds}")
    if point.few_prompts:
        parts.append(few_prompts_note(point.prompts))
    return " · ".join(parts)


def _kib(point: SweepPoint) -> str:
    return f"{point.bytes_compressed / 1024:,.1f} KiB"


class FrontierPlot(QWidget):
    """Scatter + per-method lines + Pareto frontier; `pointClicked(index)` and `hoverInfo(text)` signals."""

    pointClicked = Signal(int)  # noqa: N815 (Qt signal naming)
    hoverInfo = Signal(str)  # noqa: N815

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("frontierPlotWidget")
        self._points: list[Point] = []
        self.errorBars: pg.ErrorBarItem | None = None  # a results file's intervals, in view coordinates
        self._front: list[int] = []
        self._hovered: int | None = None
        self.baseline: str | None = None  # the sweep's dense cache element type, for labels

        self.metricCombo = QComboBox(objectName="frontierMetricCombo")
        self.xCombo = QComboBox(objectName="frontierXCombo")
        self.xCombo.addItem("bytes, % of dense", X_PERCENT)
        self.xCombo.addItem("bytes", X_BYTES)
        for combo in (self.metricCombo, self.xCombo):  # long metric names shrink with the dock, not widen it
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(8)
        self.exportImageButton = QPushButton("Export image…", objectName="frontierExportImageButton")
        self.exportImageButton.setToolTip("Save the frontier plot as PNG or SVG")
        self.view = pg.PlotWidget(
            objectName="frontierPlot", background="w", axisItems={"left": ScientificAxis("left")}
        )
        self.plot: pg.PlotItem = self.view.getPlotItem()
        self.plot.showGrid(x=True, y=True, alpha=0.25)
        # The legend sits in its own column right of the plot, never over the points.
        self.legend = pg.LegendItem(offset=None, labelTextSize="10pt", brush=pg.mkBrush(255, 255, 255, 210))
        self.legend.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self.plot.layout.addItem(self.legend, 2, 3)
        self.plot.layout.setAlignment(self.legend, Qt.AlignmentFlag.AlignTop)
        self.plot.legend = self.legend  # PlotItem.addItem registers named items with it
        self.frontierList = QListWidget(objectName="frontierList")
        self.frontierList.setToolTip(
            "The Pareto frontier: no other point has fewer bytes and a better metric"
        )
        self.frontierLabel = QLabel("Pareto frontier", objectName="frontierLabel")

        top = QHBoxLayout()
        top.addWidget(QLabel("y"))
        top.addWidget(self.metricCombo, 1)
        top.addWidget(QLabel("x"))
        top.addWidget(self.xCombo)
        under = QHBoxLayout()  # the export button below the plot keeps the top row narrow
        under.addWidget(self.frontierLabel, 1)
        under.addWidget(self.exportImageButton)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.view, 3)
        layout.addLayout(under)
        layout.addWidget(self.frontierList, 1)

        self._fill_metrics()
        self.metricCombo.currentIndexChanged.connect(self._redraw)
        self.xCombo.currentIndexChanged.connect(self._redraw)
        self.view.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.view.scene().sigMouseClicked.connect(self._on_mouse_clicked)
        self.frontierList.itemActivated.connect(
            lambda item: self.pointClicked.emit(item.data(Qt.ItemDataRole.UserRole))
        )
        self._redraw()

    # -- data ---------------------------------------------------------------------------------------

    def set_points(self, points: Sequence[Point]) -> None:
        self._points = list(points)
        results = self.showing_results()
        self.xCombo.blockSignals(True)
        if results:
            self.set_x_mode(X_PERCENT)
        self.xCombo.setEnabled(not results)
        self.xCombo.setToolTip(
            "A results file has % of dense only (its prompts differ in length)" if results else ""
        )
        self.xCombo.blockSignals(False)
        self._fill_metrics()
        self._redraw()

    def set_baseline(self, dtype: str | None) -> None:
        """Name unquantized points by the dense cache's element type `dtype` (None: '16-bit')."""
        self.baseline = dtype or None
        self._redraw()

    def showing_results(self) -> bool:
        """True when the points are a prompt-set results file's (no live session behind them)."""
        return bool(self._points) and isinstance(self._points[0], ResultPoint)

    def add_point(self, point: SweepPoint) -> None:
        """Append a streamed point: existing items are updated in place, not rebuilt."""
        self._points.append(point)
        self._redraw(full=self._fill_metrics())

    def clear(self) -> None:
        self.set_points([])

    def points(self) -> list[Point]:
        return list(self._points)

    def frontier(self) -> list[int]:
        """Indices (into points()) of the Pareto frontier for the metric shown, ordered by bytes."""
        return list(self._front)

    def metric_key(self) -> str:
        return self.metricCombo.currentData() or DEFAULT_METRIC

    def set_metric(self, key: str) -> None:
        index = self.metricCombo.findData(key)
        if index < 0:
            raise ValueError(
                f"metric {key!r} is not available here; choose one of {', '.join(self._metric_keys())}"
            )
        self.metricCombo.setCurrentIndex(index)

    def x_mode(self) -> str:
        return self.xCombo.currentData()

    def set_x_mode(self, mode: str) -> None:
        self.xCombo.setCurrentIndex(self.xCombo.findData(mode))

    def xy(self) -> tuple[np.ndarray, np.ndarray]:
        """The plotted coordinates of every point, in data units (y before any log floor)."""
        key = self.metric_key()
        xs = [
            p.percent_of_dense if self.x_mode() == X_PERCENT else float(p.bytes_compressed)
            for p in self._points
        ]
        ys = [metric_value(p.metrics, key) for p in self._points]
        return np.array(xs, dtype=float), np.array(ys, dtype=float)

    def intervals(self) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) of the metric shown for every point, in data units; NaN where a point has none."""
        key = self.metric_key()
        bounds = [getattr(p, "intervals", {}).get(key, (math.nan, math.nan)) for p in self._points]
        return np.array([b[0] for b in bounds], dtype=float), np.array([b[1] for b in bounds], dtype=float)

    def has_data(self) -> bool:
        return bool(self._points)

    def export_image(self, path: str | os.PathLike[str], width: int | None = None) -> None:
        """Write the plot and its legend to PNG (`width` pixels wide) or SVG, the y axis named in full."""
        self.plot.setLabel("left", self._y_label(short=False))
        try:
            export_graphics(self.plot, path, width)
        finally:
            self.plot.setLabel("left", self._y_label(short=True))

    def _y_label(self, short: bool) -> str:
        metric = METRICS[self.metric_key()]
        name = _SHORT_LABELS.get(metric.key, metric.label) if short else metric.label
        return name + (" ↑" if metric.higher_is_better else " ↓")

    # -- hit testing ----------------------------------------------------------------------------------

    def scene_position(self, index: int) -> QPointF:
        """Where point `index` is drawn, in scene coordinates (log axes taken into account)."""
        xs, ys = self._display_xy()
        return self.plot.vb.mapViewToScene(QPointF(float(xs[index]), float(ys[index])))

    def widget_position(self, index: int):  # noqa: ANN201 (QPoint)
        """Where point `index` is drawn, in the plot view's viewport coordinates (for a real mouse event)."""
        return self.view.mapFromScene(self.scene_position(index))

    def point_at(self, scene_pos: QPointF) -> int | None:
        """The point nearest `scene_pos` within HIT_PIXELS, or None."""
        if not self._points or not self.plot.vb.sceneBoundingRect().contains(scene_pos):
            return None
        best, best_d = None, float(HIT_PIXELS)
        for i in range(len(self._points)):
            p = self.scene_position(i)
            d = math.hypot(p.x() - scene_pos.x(), p.y() - scene_pos.y())
            if d <= best_d:
                best, best_d = i, d
        return best

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        index = self.point_at(scene_pos)
        if index == self._hovered:
            return
        self._hovered = index
        text = "" if index is None else point_text(self._points[index], self.baseline)
        self.view.setToolTip(text)
        self.hoverInfo.emit(text)

    def _on_mouse_clicked(self, event) -> None:  # noqa: ANN001 (pyqtgraph MouseClickEvent)
        if event.button() != Qt.MouseButton.LeftButton:
            return
        index = self.point_at(event.scenePos())
        if index is not None:
            event.accept()
            self.pointClicked.emit(index)

    # -- drawing --------------------------------------------------------------------------------------

    def _metric_keys(self) -> list[str]:
        present = {k for p in self._points for k, v in p.metrics.items() if v is not None}
        if self.showing_results():
            return [k for k in METRICS if k in present]
        return [k for k in METRICS if k not in _OPTIONAL_METRICS or k in present]

    def _fill_metrics(self) -> bool:
        """Offer the metrics the points have; True when the choice changed."""
        keys = self._metric_keys()
        if [self.metricCombo.itemData(i) for i in range(self.metricCombo.count())] == keys:
            return False
        current = self.metricCombo.currentData() or DEFAULT_METRIC
        self.metricCombo.blockSignals(True)
        self.metricCombo.clear()
        for k in keys:
            self.metricCombo.addItem(METRICS[k].label, k)
        self.metricCombo.setCurrentIndex(max(self.metricCombo.findData(current), 0))
        self.metricCombo.blockSignals(False)
        return True

    def _display_xy(self) -> tuple[np.ndarray, np.ndarray]:
        """Coordinates in the ViewBox (log10 of y on a log axis, floored at LOG_FLOOR)."""
        xs, ys = self.xy()
        if METRICS[self.metric_key()].log:
            ys = np.log10(np.maximum(ys, LOG_FLOOR))
        return xs, ys

    def _redraw(self, *_: object, full: bool = True) -> None:
        """Draw the points; `full` rebuilds every item (a new metric, axis or point set), otherwise the existing
        items get new data and only missing ones are made, so a streamed point costs a few setData calls."""
        metric = METRICS[self.metric_key()]
        if full:
            self.plot.clear()
            self.legend.clear()
            self._items: dict[tuple[str, tuple[int, int]], pg.PlotDataItem] = {}
            self._frontier_item: pg.PlotDataItem | None = None
            self.plot.setLogMode(x=False, y=metric.log)
            bytes_axis = self.x_mode() == X_BYTES
            dense = (
                f"% of dense {self.baseline}"
                if self.baseline and not self.showing_results()
                else "% of dense"
            )
            self.plot.setLabel(
                "bottom",
                "compressed KV cache" + ("" if bytes_axis else f" ({dense})"),
                units="B" if bytes_axis else None,
            )
            self.plot.setLabel("left", self._y_label(short=True))
            self.plot.enableAutoRange()  # new points, metric or axis: all in view (a user's zoom was for the old)
        xs, ys = self.xy()
        plotted_y = np.maximum(ys, LOG_FLOOR) if metric.log else ys
        groups: dict[tuple[str, tuple[int, int]], list[int]] = {}
        for i, p in enumerate(self._points):
            groups.setdefault((p.config.method, p.config.widths), []).append(i)
        methods = list(dict.fromkeys(p.config.method for p in self._points))
        for (method, bits), idx in groups.items():
            idx.sort(key=lambda i: self._points[i].config.ratio)
            item = self._items.get((method, bits))
            if item is None:
                item = self._new_item(method, bits, methods.index(method))
                self._items[(method, bits)] = item
                self.plot.addItem(item)
            item.setData(xs[idx], plotted_y[idx])
        self._front = pareto_front(xs.tolist(), ys.tolist(), metric.higher_is_better)
        if self._frontier_item is None and self._front:
            self._frontier_item = pg.PlotDataItem(
                pen=FRONTIER_PEN,
                symbol="o",
                symbolSize=15,
                symbolBrush=None,
                symbolPen=pg.mkPen((20, 20, 20), width=1.5),
                name="Pareto frontier",
            )
            self.plot.addItem(self._frontier_item)
        if self._frontier_item is not None:
            self._frontier_item.setData(xs[self._front], plotted_y[self._front])
        if full:
            self._draw_error_bars(metric.log)
        self._fill_frontier_list()

    def _draw_error_bars(self, log: bool) -> None:
        """One vertical bar per point that has an interval, from its low to its high (log10 on a log axis:
        the bar item is drawn in view coordinates, which pyqtgraph's log mode does not transform)."""
        self.errorBars = None
        _, ys = self.xy()
        low, high = self.intervals()
        keep = ~(np.isnan(ys) | np.isnan(low) | np.isnan(high))
        if not keep.any():
            return
        xs, _ = self._display_xy()
        y, lo, hi = ys[keep], low[keep], high[keep]
        if log:
            y, lo, hi = (np.log10(np.maximum(v, LOG_FLOOR)) for v in (y, lo, hi))
        x = xs[keep]
        beam = 0.02 * max(float(x.max() - x.min()), 5.0)  # a short cap however narrow the x range
        self.errorBars = pg.ErrorBarItem(x=x, y=y, top=hi - y, bottom=y - lo, beam=beam, pen=ERROR_BAR_PEN)
        self.plot.addItem(self.errorBars)

    def _new_item(self, method: str, bits: tuple[int, int], m_index: int) -> pg.PlotDataItem:
        """One method's line at one (key, value) width: its colour and marker, dashed when quantized, named once."""
        colour = PALETTE[m_index % len(PALETTE)]
        named = not any(m == method for m, _ in self._items)
        return pg.PlotDataItem(
            pen=pg.mkPen(
                colour,
                width=1.5,
                style=Qt.PenStyle.SolidLine if bits == (UNQUANTIZED_BITS,) * 2 else Qt.PenStyle.DashLine,
            ),
            symbol=SYMBOLS[m_index % len(SYMBOLS)],
            symbolBrush=pg.mkBrush(*colour),
            symbolPen=pg.mkPen(colour),
            symbolSize=9,
            name=method if named else None,
        )

    def _fill_frontier_list(self) -> None:
        self.frontierList.clear()
        for i in self._front:
            self.frontierList.addItem(point_text(self._points[i], self.baseline))
            self.frontierList.item(self.frontierList.count() - 1).setData(Qt.ItemDataRole.UserRole, i)
        if self.showing_results():
            self.frontierLabel.setText(
                f"Pareto frontier over the means: {len(self._front)} of {len(self._points)} configurations "
                "(bars: each one's bootstrap interval)"
            )
        else:
            self.frontierLabel.setText(f"Pareto frontier: {len(self._front)} of {len(self._points)} points")

    def frontier_texts(self) -> list[str]:
        return [self.frontierList.item(i).text() for i in range(self.frontierList.count())]
