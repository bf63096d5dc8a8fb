"""The cache timeline (issue 40): x = position (prompt, then generated tokens), y = decode step, colour = held or
evicted, for one (layer, kv-head) or as the share of kv-heads holding it; under it, the per-token KL and top-1
agreement against the dense cache on the same history, columns aligned with the positions above.

A step slider (arrow keys, PageUp/PageDown by one eviction interval, Home/End) picks step k: a line marks it
and `stepChanged` lets the window show the whole cache at k in the main heatmap. Fed a TimelineView (plain
data from the engine thread); it never talks to the engine.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.engine.timeline_jobs import CamMerges, TimelineView, policy_text
from app.widgets.axes import ScientificAxis
from app.widgets.heatmap import KEPT_RGBA
from app.widgets.hover import show_hover
from app.widgets.method_tip import policy_tip
from app.widgets.plot_export import export_graphics
from app.widgets.token_axis import TokenAxis, token_label
from app.widgets.token_strip import AGREE_BRUSH, DENSE_BRUSH, DISAGREE_BRUSH, DIVERGENCE_PEN, KL_BRUSH
from kvcore.defaults import DEFAULT_DECODE_INTERVAL, DEFAULT_N_SINK
from kvcore.engine.decoding import DECODE_METHODS
from kvcore.engine.timeline import NEVER

SHOW_HEAD = "One kv-head"
SHOW_SHARE = "Share of kv-heads"
#: The run controls' starting values: a budget a 1,024-token run overflows four times.
START_BUDGET = 256
START_TOKENS = 1024
MAX_TOKENS = 8192
#: Evicted cells: lighter than the heatmap's near-black, so they stand apart from the not-yet-written background.
EVICTED_RGBA = (62, 66, 88, 255)
UNWRITTEN_RGBA = (0, 0, 0, 0)
#: The image is sampled down to at most this many rows and columns (8,192 steps × 10k positions would be 320 MB).
MAX_IMAGE = (2048, 4096)
_AXIS_WIDTH = 52
#: The run controls' column: the plot takes the rest of the dock's width.
SIDE_WIDTH = 200
_STEP_PEN = pg.mkPen((0, 230, 255), width=2)
#: cam's merges: a white arc from each evicted position to a row its value went into, at the step it left.
_MERGE_PEN = pg.mkPen((255, 255, 255, 210), width=1.5)
_MERGE_POINTS = 9
#: An arc over _MERGE_SPAN positions or more rises half an eviction interval above its step; shorter ones less.
_MERGE_SPAN = 48
#: At most this many cam arcs drawn at once (those in view).
MAX_MERGE_ARCS = 20_000
_PROMPT_PEN = pg.mkPen((235, 235, 235), width=1, style=Qt.PenStyle.DashLine)


def _swatch(rgb: tuple[int, ...], text: str) -> str:
    return f'<span style="color: rgb{tuple(rgb[:3])}">■</span> {text}'


_HEAD_LEGEND = " &nbsp;".join(
    [_swatch(KEPT_RGBA, "held"), _swatch(EVICTED_RGBA, "evicted"), "black: not written yet"]
)
#: White arcs cannot be shown in a swatch on the light legend: named instead.
_MERGE_LEGEND = "white arcs: cam merges (evicted → target)"
_SHARE_LEGEND = " &nbsp;".join(
    [_swatch(EVICTED_RGBA, "no head"), "→", _swatch(KEPT_RGBA, "every compressible kv-head holds it")]
)
_STRIP_LEGEND = " &nbsp;".join(
    [
        _swatch(KL_BRUSH, "KL(dense ‖ policy)"),
        _swatch(AGREE_BRUSH, "same top-1"),
        _swatch(DISAGREE_BRUSH, "other"),
        '<span style="color: rgb(255, 120, 90)">┆</span> first divergence',
    ]
)


def _ramp(n: int = 256) -> np.ndarray:
    """n colours from evicted (no head holds it) to kept (every head does)."""
    t = np.linspace(0.0, 1.0, n)[:, None]
    return np.rint(np.array(EVICTED_RGBA) * (1 - t) + np.array(KEPT_RGBA) * t).astype(np.uint8)


_RAMP = _ramp()


def render_head(history: np.ndarray, written: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """[rows, P] held mask at `steps` [rows] and [P] write steps -> [rows, P, 4] RGBA: held, evicted, or
    transparent (not written yet)."""
    idx = np.where(history, 2, np.where(written[None, :] <= steps[:, None], 1, 0)).astype(np.uint8)
    return np.array([UNWRITTEN_RGBA, EVICTED_RGBA, KEPT_RGBA], dtype=np.uint8)[idx]


def render_share(share: np.ndarray, written: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """[rows, P] share of heads holding each position at `steps` -> RGBA on the evicted→kept ramp; positions not
    written yet transparent."""
    rgba = _RAMP[np.clip(np.rint(share * 255), 0, 255).astype(np.uint8)]
    rgba[written[None, :] > steps[:, None]] = UNWRITTEN_RGBA
    return rgba


class TimelinePanel(QWidget):
    """Run controls, the timeline image with its KL and agreement rows, and the step slider."""

    runRequested = Signal()  # noqa: N815 (Qt signal naming)
    cancelRequested = Signal()  # noqa: N815
    stepChanged = Signal(int)  # noqa: N815
    hoverInfo = Signal(str)  # noqa: N815

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("timelinePanel")
        self._view: TimelineView | None = None
        self._last_hover: tuple | None = None
        self._build_ui()

    # -- layout -----------------------------------------------------------------------------------

    def _build_ui(self) -> None:
        self.methodCombo = QComboBox(objectName="timelineMethodCombo")
        self.methodCombo.addItems(list(DECODE_METHODS))
        for i, name in enumerate(DECODE_METHODS):
            self.methodCombo.setItemData(i, policy_tip(name), Qt.ItemDataRole.ToolTipRole)
        self.methodCombo.setToolTip("The decoding-time policy that evicts while the model writes")
        self.budgetSpin = self._spin(
            "timelineBudgetSpin", 1, 1_000_000, START_BUDGET, "rows kept per kv-head"
        )
        self.intervalSpin = self._spin(
            "timelineIntervalSpin",
            1,
            MAX_TOKENS,
            DEFAULT_DECODE_INTERVAL,
            "generated tokens between evictions",
        )
        self.tokensSpin = self._spin("timelineTokensSpin", 1, MAX_TOKENS, START_TOKENS, "tokens to generate")
        self.prefillCheck = QCheckBox("after prefill compression", objectName="timelinePrefillCheck")
        self.prefillCheck.setChecked(True)
        self.prefillCheck.setToolTip(
            "Start from the cache the Compression panel made (checked) or from the full prefill cache"
        )
        self.beyondCheck = QCheckBox("Beyond trained context", objectName="timelineBeyondCheck")
        self.beyondCheck.setToolTip(
            "Let prompt + tokens pass the model's trained context (max_position_embeddings): RoPE extrapolates, "
            "the quality past it is yours to judge"
        )
        self.runButton = QPushButton("Decode", objectName="timelineRunButton")
        self.runButton.setToolTip("Generate the tokens under the policy and draw its timeline")
        self.cancelButton = QPushButton("Cancel", objectName="timelineCancelButton")
        self.cancelButton.setToolTip("Stop (Esc); what was generated so far is kept and drawn")
        self.cancelButton.setEnabled(False)
        self.progressBar = QProgressBar(objectName="timelineProgress")
        self.progressBar.setRange(0, 1000)
        self.progressBar.setTextVisible(False)
        self.progressBar.setVisible(False)
        self.showCombo = QComboBox(objectName="timelineShowCombo")
        self.showCombo.addItems([SHOW_HEAD, SHOW_SHARE])
        self.showCombo.setToolTip(
            "Colour: one (layer, kv-head)'s held positions, or the share of kv-heads holding them"
        )
        self.layerCombo = QComboBox(objectName="timelineLayerCombo")
        self.headCombo = QComboBox(objectName="timelineHeadCombo")
        self.legendLabel = QLabel(_HEAD_LEGEND, objectName="timelineLegend")
        self.legendLabel.setWordWrap(True)

        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setObjectName("timelineGraphics")
        self.graphics.ci.setSpacing(0)
        self._x_axis = TokenAxis()
        self.plot = self.graphics.addPlot(row=0, col=0)
        self.klPlot = self.graphics.addPlot(row=1, col=0, axisItems={"left": ScientificAxis("left")})
        self.agreePlot = self.graphics.addPlot(row=2, col=0, axisItems={"bottom": self._x_axis})
        layout = self.graphics.ci.layout
        for row, stretch in ((0, 8), (1, 2), (2, 1)):
            layout.setRowStretchFactor(row, stretch)
        for plot in (self.plot, self.klPlot, self.agreePlot):
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.getAxis("left").setWidth(_AXIS_WIDTH)
            plot.getAxis("left").enableAutoSIPrefix(False)
        self.plot.invertY(True)
        self.plot.setLabel("left", "decode step")
        self.plot.getAxis("bottom").setStyle(showValues=False)
        self.klPlot.getAxis("bottom").setStyle(showValues=False)
        self.klPlot.setLabel("left", "KL")
        self.klPlot.setMouseEnabled(x=True, y=False)
        self.agreePlot.setMouseEnabled(x=True, y=False)
        self.agreePlot.setYRange(0, 1, padding=0)
        self.agreePlot.getAxis("left").setTicks([[(0.5, "top-1")]])
        self.agreePlot.setLabel("bottom", "position (prompt, then generated tokens)")
        self.klPlot.setXLink(self.plot)
        self.agreePlot.setXLink(self.plot)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.klBars = pg.BarGraphItem(x0=[], x1=[], height=[], brush=KL_BRUSH, pen=None)
        self.klPlot.addItem(self.klBars)
        self.agreeImage = pg.ImageItem(axisOrder="row-major")
        self.agreePlot.addItem(self.agreeImage)
        self.mergeArcs = pg.PlotDataItem(pen=_MERGE_PEN, connect="finite")
        self.mergeArcs.setZValue(8)
        self.plot.addItem(self.mergeArcs)
        self.stepLine = pg.InfiniteLine(angle=0, movable=False, pen=_STEP_PEN)
        self.stepLine.setZValue(10)
        self.plot.addItem(self.stepLine)
        self.promptLines = []
        self.divergenceLines = []
        for plot in (self.plot, self.klPlot, self.agreePlot):
            prompt = pg.InfiniteLine(angle=90, movable=False, pen=_PROMPT_PEN)
            div = pg.InfiniteLine(angle=90, movable=False, pen=DIVERGENCE_PEN)
            for line in (prompt, div):
                line.setZValue(9)
                line.setVisible(False)
                plot.addItem(line)
            self.promptLines.append(prompt)
            self.divergenceLines.append(div)

        self.stripLegend = QLabel(_STRIP_LEGEND, objectName="timelineStripLegend")
        self.stepSlider = QSlider(Qt.Orientation.Horizontal, objectName="timelineStepSlider")
        self.stepSlider.setRange(0, 0)
        self.stepSlider.setToolTip(
            "Decode step shown in the heatmap: ←/→ one step, PageUp/PageDown one eviction interval on/back, Home/End"
        )
        self.stepLabel = QLabel("Step –", objectName="timelineStepLabel")
        self.stepLabel.setMinimumWidth(
            self.stepLabel.fontMetrics().horizontalAdvance("Step 8,192 / 8,192 · evicted")
        )
        self.exportImageButton = QPushButton("Image…", objectName="timelineExportImageButton")
        self.exportImageButton.setToolTip("Save the timeline with its KL rows as PNG or SVG")
        self.exportCsvButton = QPushButton("CSV…", objectName="timelineExportCsvButton")
        self.exportCsvButton.setToolTip(
            "Save (step, layer, kv_head, position, kept): kept 1 from the step a position is held, 0 from the step "
            "it left"
        )
        step_row = QHBoxLayout()
        step_row.setContentsMargins(0, 0, 0, 0)
        step_row.addWidget(QLabel("Step"))
        step_row.addWidget(self.stepSlider, 1)
        step_row.addWidget(self.stepLabel)

        self.summaryLabel = QLabel("Prefill a prompt, then Decode: each row is the cache after that step.")
        self.summaryLabel.setObjectName("timelineSummary")
        self.summaryLabel.setWordWrap(True)

        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Policy", self.methodCombo)
        form.addRow("Budget", self.budgetSpin)
        form.addRow("Every", self.intervalSpin)
        form.addRow("Tokens", self.tokensSpin)
        buttons = QHBoxLayout()
        buttons.addWidget(self.runButton)
        buttons.addWidget(self.cancelButton)
        shown = QFormLayout()
        shown.setContentsMargins(0, 0, 0, 0)
        shown.addRow("Show", self.showCombo)
        shown.addRow("Layer", self.layerCombo)
        shown.addRow("kv-head", self.headCombo)
        exports = QHBoxLayout()
        exports.addWidget(QLabel("Export"))
        exports.addWidget(self.exportImageButton)
        exports.addWidget(self.exportCsvButton)
        side = QVBoxLayout()
        side.setContentsMargins(0, 0, 0, 0)
        side.addLayout(form)
        side.addWidget(self.prefillCheck)
        side.addWidget(self.beyondCheck)
        side.addLayout(buttons)
        side.addWidget(self.progressBar)
        side.addSpacing(6)
        side.addLayout(shown)
        side.addStretch(1)
        side.addLayout(exports)
        column = QWidget(objectName="timelineControls")
        column.setLayout(side)
        column.setFixedWidth(SIDE_WIDTH)

        main = QVBoxLayout()
        main.setContentsMargins(0, 0, 0, 0)
        main.setSpacing(2)
        main.addWidget(self.summaryLabel)
        main.addWidget(self.legendLabel)
        main.addWidget(self.graphics, 1)
        main.addWidget(self.stripLegend)
        main.addLayout(step_row)
        outer = QHBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(column)
        outer.addLayout(main, 1)

        self.runButton.clicked.connect(self.runRequested)
        self.cancelButton.clicked.connect(self.cancelRequested)
        self.showCombo.currentIndexChanged.connect(self._redraw)
        self.layerCombo.currentIndexChanged.connect(self._redraw)
        self.headCombo.currentIndexChanged.connect(self._redraw)
        self.stepSlider.valueChanged.connect(self._on_step)
        self.graphics.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.plot.vb.sigRangeChanged.connect(self._draw_merges)
        self._update_choosers()

    @staticmethod
    def _spin(name: str, lo: int, hi: int, value: int, tip: str) -> QSpinBox:
        spin = QSpinBox(objectName=name)
        spin.setRange(lo, hi)
        spin.setValue(value)
        spin.setGroupSeparatorShown(True)
        spin.setToolTip(tip)
        return spin

    # -- public API -------------------------------------------------------------------------------

    def policy(self) -> dict:
        """The run controls as DecodingPolicy's fields (n_sink: the attention sinks streaming_llm keeps)."""
        return {
            "method": self.methodCombo.currentText(),
            "budget": self.budgetSpin.value(),
            "interval": self.intervalSpin.value(),
            "n_sink": DEFAULT_N_SINK,
        }

    def set_policy(self, method: str, budget: int, interval: int, tokens: int) -> None:
        index = self.methodCombo.findText(method)
        if index < 0:
            raise ValueError(f"decoding method {method!r} is not one of {', '.join(DECODE_METHODS)}")
        self.methodCombo.setCurrentIndex(index)
        self.budgetSpin.setValue(budget)
        self.intervalSpin.setValue(interval)
        self.tokensSpin.setValue(tokens)

    def tokens(self) -> int:
        return self.tokensSpin.value()

    def from_prefill_compression(self) -> bool:
        return self.prefillCheck.isChecked()

    def beyond_context(self) -> bool:
        """Whether a run may pass the model's trained context."""
        return self.beyondCheck.isChecked()

    def set_running(self, running: bool) -> None:
        self.runButton.setEnabled(not running)
        self.cancelButton.setEnabled(running)
        self.progressBar.setVisible(running)
        self.progressBar.setValue(0)

    def show_progress(self, fraction: float, text: str) -> None:
        self.progressBar.setValue(int(round(1000 * max(0.0, min(1.0, fraction)))))
        if text:
            self.summaryLabel.setText(text)

    def set_summary(self, text: str) -> None:
        self.summaryLabel.setText(text)

    def view(self) -> TimelineView | None:
        return self._view

    def has_data(self) -> bool:
        return self._view is not None

    def set_view(self, view: TimelineView | None) -> None:
        """Show a run (None: nothing); the slider goes to its last step."""
        self._view = view
        self._last_hover = None
        self._update_choosers()
        tl = None if view is None else view.timeline
        self.stepSlider.blockSignals(True)
        self.stepSlider.setRange(0, 0 if tl is None else tl.n_steps)
        self.stepSlider.setPageStep(max(1, int(view.policy["interval"])) if view else 1)
        self.stepSlider.setValue(0 if tl is None else tl.n_steps)
        self.stepSlider.blockSignals(False)
        self._draw_strip()
        self._redraw()
        self._on_step(self.stepSlider.value())

    def clear(self) -> None:
        self.set_view(None)
        self.set_summary("Prefill a prompt, then Decode: each row is the cache after that step.")

    def step(self) -> int:
        return self.stepSlider.value()

    def set_step(self, step: int) -> None:
        self.stepSlider.setValue(step)

    def head(self) -> tuple[int, int] | None:
        """The (layer, kv-head) shown, or None when the share of heads is."""
        if self.showCombo.currentText() == SHOW_SHARE:
            return None
        return max(self.layerCombo.currentIndex(), 0), max(self.headCombo.currentIndex(), 0)

    def set_head(self, layer: int | None, kv_head: int = 0) -> None:
        """Show one (layer, kv-head), or the share of heads (layer None)."""
        self.showCombo.setCurrentText(SHOW_SHARE if layer is None else SHOW_HEAD)
        if layer is not None:
            self.layerCombo.setCurrentIndex(layer)
            self.headCombo.setCurrentIndex(kv_head)

    def kept_rows(self, step: int) -> np.ndarray:
        """[L·H_kv, written positions] bool: what every (layer, kv-head) holds at `step` (the heatmap's rows)."""
        tl = self._view.timeline
        written = tl.n_start + step
        held = tl.held(step)[:, :, :written]
        return held.reshape(-1, written)

    def info_at(self, step: int, position: int) -> str:
        """Hover text of a cell: the token, when it was written and when it left the shown head's cache."""
        v = self._view
        tl = v.timeline
        text = token_label(v.token_texts[position], 40)
        where = f"prompt {position}" if position < v.n_prompt else f"generated {position - v.n_prompt}"
        parts = [f"Step {step}", f"position {position} ({where})", f"token '{text}'"]
        if position >= tl.n_positions:
            parts.append("the last token generated: never written to the cache")
            return " · ".join(parts)
        written = int(tl.written_at[position])
        if written > step:
            parts.append(f"not written yet (written at step {written})")
            return " · ".join(parts)
        head = self.head()
        share = tl.share_at(step)[position]
        if head is not None:
            layer, h = head
            parts.append(f"L{layer} h{h}: {self._fate(layer, h, position, step)}")
            merged = self.merge_info(layer, h, position, step)
            if merged:
                parts.append(merged)
        parts.append(f"held by {100 * share:.0f} % of the compressible kv-heads at this step")
        return " · ".join(parts)

    def merge_info(self, layer: int, h: int, position: int, step: int) -> str | None:
        """cam's merges at (layer, kv-head) for `position`: where its value went when it left, and how many merged
        values it holds by `step`; None when cam merged nothing there."""
        m = self._view.merges
        if m is None:
            return None
        mine = m.of_head(layer, h)
        out = []
        went = mine[m.source[mine] == position]
        if went.size:
            tokens = self._view.token_texts
            named = [f"{int(m.target[i])} '{token_label(tokens[int(m.target[i])], 12)}'" for i in went]
            into = (
                f"position {named[0]}"
                if went.size == 1
                else f"{went.size} positions ({', '.join(named[:3])}{' … ' + named[-1] if went.size > 3 else ''})"
            )
            out.append(
                f"merged at step {int(m.step[went[0]])} into {into}, {100 * float(m.share[went[0]]):.1f} % of its "
                "value each"
            )
        held = mine[(m.target[mine] == position) & (m.step[mine] <= step)]
        if held.size:
            out.append(f"holds {held.size} merged value{'s' if held.size > 1 else ''} by this step")
        return " · ".join(out) or None

    def merge_arcs(self) -> list[tuple[int, int, int]]:
        """(step, evicted position, target position) of every cam merge of the shown head (none for the share)."""
        m, idx = self._merge_indices()
        return [(int(m.step[i]), int(m.source[i]), int(m.target[i])) for i in idx]

    def _merge_indices(self) -> tuple[CamMerges | None, np.ndarray]:
        v, head = self._view, self.head()
        if v is None or v.merges is None or head is None:
            return None, np.zeros(0, np.int64)
        return v.merges, v.merges.of_head(*head)

    def _draw_merges(self, *_: object) -> None:
        """The shown head's arcs in view (at most MAX_MERGE_ARCS, evenly spaced: an 8k-token run merges 100k+)."""
        m, idx = self._merge_indices()
        if idx.size:
            (x0, x1), (y0, y1) = self.plot.vb.viewRange()
            lo, hi = np.minimum(m.source[idx], m.target[idx]), np.maximum(m.source[idx], m.target[idx])
            step = m.step[idx]
            idx = idx[
                (hi + 1 >= x0) & (lo <= x1) & (step + 1 >= min(y0, y1)) & (step - self._rise() <= max(y0, y1))
            ]
        if idx.size > MAX_MERGE_ARCS:
            idx = idx[np.linspace(0, idx.size - 1, MAX_MERGE_ARCS).astype(np.int64)]
        if not idx.size:
            self.mergeArcs.setData([], [])
            return
        step, source, target = (a[idx].astype(np.float64) for a in (m.step, m.source, m.target))
        s = np.linspace(0.0, 1.0, _MERGE_POINTS)
        x = source[:, None] + 0.5 + (target - source)[:, None] * s[None, :]
        height = self._rise() * np.sqrt(np.minimum(1.0, np.abs(target - source) / _MERGE_SPAN))[:, None]
        y = step[:, None] + 0.5 - height * 4 * s * (1 - s)
        nan = np.full((idx.size, 1), np.nan)
        self.mergeArcs.setData(np.hstack([x, nan]).ravel(), np.hstack([y, nan]).ravel())

    def _rise(self) -> float:
        """How far above its step the longest arc rises: half an eviction interval."""
        return 0.5 * max(1, int(self._view.policy["interval"]))

    def export_image(self, path: str | os.PathLike[str], width: int | None = None) -> None:
        """Write the timeline with its KL and agreement rows to PNG or SVG (by suffix), atomically."""
        export_graphics(self.graphics.ci, path, width)

    # -- internals --------------------------------------------------------------------------------

    def _fate(self, layer: int, h: int, position: int, step: int) -> str:
        tl = self._view.timeline
        if layer in tl.whole_layers:
            label = self._view.not_compressible_labels.get(layer, "stored whole")
            return f"held ({label})"
        ev = int(tl.evicted_at[layer, h, position])
        written = int(tl.written_at[position])
        if position < tl.n_start and not tl.start_held[layer, h, position]:
            return "dropped by the prefill compression"
        if ev == NEVER:
            return "held; kept to the end"
        if ev == written:
            return f"evicted at step {ev}, as it was written"
        return f"held; evicted at step {ev}" if ev > step else f"evicted at step {ev}"

    def _update_choosers(self) -> None:
        v = self._view
        for combo, n, name in (
            (self.layerCombo, 0 if v is None else v.n_layers, "Layer"),
            (self.headCombo, 0 if v is None else v.n_kv_heads, "h"),
        ):
            current = combo.currentIndex()
            combo.blockSignals(True)
            combo.clear()
            for i in range(n):
                whole = name == "Layer" and v is not None and i in v.timeline.whole_layers
                combo.addItem(f"{name} {i}" + (" ✕" if whole else "") if name == "Layer" else f"h{i}")
            if 0 <= current < n:
                combo.setCurrentIndex(current)
            combo.blockSignals(False)
        share = self.showCombo.currentText() == SHOW_SHARE
        self.layerCombo.setEnabled(not share and v is not None)
        self.headCombo.setEnabled(not share and v is not None)
        for w in (self.exportImageButton, self.exportCsvButton, self.stepSlider):
            w.setEnabled(v is not None)

    def _sampled(self) -> tuple[np.ndarray, np.ndarray]:
        """The steps and positions the image draws: all of them, or every n-th past MAX_IMAGE (hover, the slider
        and the heatmap stay exact)."""
        tl = self._view.timeline
        rows, cols = tl.n_steps + 1, tl.n_positions
        return (
            np.arange(0, rows, math.ceil(rows / MAX_IMAGE[0])),
            np.arange(0, cols, max(1, math.ceil(cols / MAX_IMAGE[1]))),
        )

    def displayed_row(self, step: int) -> np.ndarray:
        """The colour row drawn for `step` at one column per position (RGBA), for the head or the share shown."""
        tl = self._view.timeline
        at = np.array([step])
        head = self.head()
        if head is None:
            return render_share(tl.share_at(step)[None, :], tl.written_at, at)[0]
        return render_head(tl.held(step)[head[0], head[1]][None, :], tl.written_at, at)[0]

    def _redraw(self, *_: object) -> None:
        share = self.showCombo.currentText() == SHOW_SHARE
        self.layerCombo.setEnabled(not share and self._view is not None)
        self.headCombo.setEnabled(not share and self._view is not None)
        v = self._view
        cam = not share and v is not None and v.merges is not None
        self.legendLabel.setText(
            _SHARE_LEGEND if share else _HEAD_LEGEND + (" &nbsp;" + _MERGE_LEGEND if cam else "")
        )
        self._draw_merges()
        if v is None:
            self.image.clear()
            for line in (*self.promptLines, *self.divergenceLines):
                line.setVisible(False)
            self.stepLine.setVisible(False)
            return
        tl = v.timeline
        steps, cols = self._sampled()
        written = tl.written_at[cols]
        head = self.head()
        if head is None:
            rgba = render_share(tl.share_held(steps)[:, cols], written, steps)
        else:
            rgba = render_head(tl.head_history(*head, steps)[:, cols], written, steps)
        self.image.setImage(rgba, autoLevels=False, levels=(0, 255))
        row_step = steps[1] - steps[0] if len(steps) > 1 else 1
        col_step = cols[1] - cols[0] if len(cols) > 1 else 1
        self.image.setRect(QRectF(0, 0, len(cols) * col_step, len(steps) * row_step))
        rows = tl.n_steps + 1
        for plot in (self.plot, self.klPlot, self.agreePlot):
            plot.setLimits(xMin=0, xMax=v.n_columns)
        self.plot.setLimits(yMin=0, yMax=rows)
        self.plot.setRange(xRange=(0, v.n_columns), yRange=(0, rows), padding=0)
        for line in self.promptLines:
            line.setPos(v.n_prompt)
            line.setVisible(True)
        self.promptLines[0].setToolTip("Left: the prompt · right: the generated tokens")
        self._x_axis.tokens = v.token_texts
        self._x_axis.picture = None
        self._x_axis.update()
        self._last_hover = None

    def _draw_strip(self) -> None:
        v = self._view
        steps = None if v is None else v.token_steps
        if steps is None:
            self.klBars.setOpts(x0=[], x1=[], height=[])
            self.agreeImage.clear()
            for line in self.divergenceLines:
                line.setVisible(False)
            return
        n = len(steps.kl)
        x0 = v.n_prompt + np.arange(n, dtype=float)
        kl = np.asarray(steps.kl, dtype=float)
        self.klBars.setOpts(x0=x0 + 0.1, x1=x0 + 0.9, height=kl)
        finite = kl[np.isfinite(kl)]
        self.klPlot.setYRange(0, float(finite.max()) * 1.05 if finite.size and finite.max() > 0 else 1.0)
        cells = np.zeros((1, v.n_columns, 4), np.uint8)
        colours = np.array([(*DISAGREE_BRUSH, 255), (*AGREE_BRUSH, 255), (*DENSE_BRUSH, 255)], np.uint8)
        index = np.asarray(steps.agreement, dtype=np.uint8).copy()
        index[: steps.first_compared] = 2
        cells[0, v.n_prompt : v.n_prompt + n] = colours[index]
        self.agreeImage.setImage(cells, autoLevels=False, levels=(0, 255))
        self.agreeImage.setRect(QRectF(0, 0.15, v.n_columns, 0.7))
        div = steps.first_divergence
        for line in self.divergenceLines:
            line.setVisible(div is not None)
            if div is not None:
                line.setPos(v.n_prompt + div + 0.5)

    def _on_step(self, step: int) -> None:
        v = self._view
        if v is None:
            self.stepLabel.setText("Step –")
            self.stepLine.setVisible(False)
            return
        self.stepLine.setPos(step + 0.5)
        self.stepLine.setVisible(True)
        evicting = " · evicted" if step in v.compression_steps else ""
        self.stepLabel.setText(f"Step {step:,} / {v.timeline.n_steps:,}{evicting}")
        self.stepChanged.emit(step)

    def keyPressEvent(self, event) -> None:  # noqa: ANN001, N802 (Qt API)
        """Up/Down anywhere in the panel move the step as the slider's keys do."""
        if event.key() in (Qt.Key.Key_Up, Qt.Key.Key_Down) and self._view is not None:
            self.set_step(self.step() + (1 if event.key() == Qt.Key.Key_Down else -1))
            return
        super().keyPressEvent(event)

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        v = self._view
        key = None
        text = ""
        if v is not None:
            if self.plot.vb.sceneBoundingRect().contains(scene_pos):
                point = self.plot.vb.mapSceneToView(scene_pos)
                step, pos = math.floor(point.y()), math.floor(point.x())
                if 0 <= step <= v.timeline.n_steps and 0 <= pos < v.n_columns:
                    key = ("cell", step, pos)
                    text = self.info_at(step, pos)
            else:
                for plot in (self.klPlot, self.agreePlot):
                    if plot.vb.sceneBoundingRect().contains(scene_pos):
                        pos = math.floor(plot.vb.mapSceneToView(scene_pos).x())
                        if v.n_prompt <= pos < v.n_columns:
                            key = ("token", pos)
                            text = self.token_info(pos - v.n_prompt)
        if key == self._last_hover:
            return
        self._last_hover = key
        show_hover(self.graphics, text)
        self.hoverInfo.emit(text)

    def token_info(self, index: int) -> str:
        """Hover text of generated token `index` in the KL rows: KL, top-1 and both caches' top tokens."""
        v = self._view
        s = v.token_steps
        if s is None or not 0 <= index < len(s.kl):
            return ""
        head = f"generated {index} '{token_label(s.tokens[index], 30)}'"
        if index < s.first_compared:
            return f"{head} · from the dense prefill: nothing to compare"
        same = "same top-1" if s.agreement[index] else "other top-1"
        dense = ", ".join(
            f"'{token_label(t, 12)}' {100 * p:.0f} %"
            for t, p in zip(s.dense_top_texts[index][:3], s.dense_top_probs[index][:3], strict=False)
        )
        policy = ", ".join(
            f"'{token_label(t, 12)}' {100 * p:.0f} %"
            for t, p in zip(
                s.compressed_top_texts[index][:3], s.compressed_top_probs[index][:3], strict=False
            )
        )
        return f"{head} · KL {float(s.kl[index]):.4g} · {same} · dense: {dense} · policy: {policy}"


def summary_text(view: TimelineView) -> str:
    """One line under the controls: the policy, what it started from, the cache's size and speed, divergence."""
    start = "the full prefill cache"
    if view.prefill_config:
        cfg = view.prefill_config
        start = f"{cfg['method']} r={cfg['ratio']:g}"
    steps = view.token_steps
    div = None if steps is None else steps.first_divergence
    n_gen = view.n_generated
    rate = n_gen / view.seconds if view.seconds > 0 else float("nan")
    agree = ""
    if steps is not None and len(steps.kl) > steps.first_compared:
        agreement = float(np.mean(steps.agreement[steps.first_compared :]))
        agree = f" · top-1 agreement {100 * agreement:.0f} % · mean KL {float(np.mean(steps.kl)):.3g}"
    first = "never diverges from dense" if div is None else f"first diverges at generated token {div}"
    cut = " · cancelled: the tokens generated so far are kept" if view.cancelled else ""
    cut += " · past the trained context" if view.beyond_context else ""
    return (
        f"{policy_text(view.policy)} after {start}: {n_gen:,} tokens in {view.seconds:.1f} s ({rate:,.0f} tok/s, "
        f"with the dense cache beside it) · {len(view.compression_steps)} evictions · at most "
        f"{view.max_cache_tokens:,} rows per kv-head{agree} · {first}{cut}"
    )
