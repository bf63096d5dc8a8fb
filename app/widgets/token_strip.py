"""Per-token strip under the continuations: KL(dense ‖ compressed) and top-1 agreement of every generated token.

One column per generated token (teacher-forced on the dense continuation, so column i compares the two
caches' predictions of dense token i on the same history); the first divergence of the free-running
continuation is marked. Hovering a column reports the token (the comparison view marks it in the text) and
shows both caches' top-5 next tokens with their probabilities.
"""

from __future__ import annotations

import html
import math
import os

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.engine.view_model import TokenSteps
from app.widgets.axes import ScientificAxis
from app.widgets.plot_export import export_graphics
from app.widgets.token_axis import TokenAxis, token_label

KL_BRUSH = (86, 180, 233)
AGREE_BRUSH = (0, 158, 115)
DISAGREE_BRUSH = (213, 94, 0)
DENSE_BRUSH = (120, 120, 130)  # tokens taken from the dense prefill ("paper"): nothing to compare
CELL_BRUSHES = {"same": AGREE_BRUSH, "other": DISAGREE_BRUSH, "dense": DENSE_BRUSH}
DIVERGENCE_PEN = pg.mkPen((255, 120, 90), width=2, style=Qt.PenStyle.DashLine)
HOVER_BRUSH = (0, 200, 255, 60)
_AXIS_WIDTH = 48  # both left axes the same width, so the two rows' columns line up
_HINT = "Hover a token in the strip for the dense and compressed top-5."


def _percent(p: float) -> str:
    return f"{100 * p:.1f} %"


def _cells(steps: TokenSteps) -> list[str]:
    """Per token: 'dense' before the first compared token, else 'same' or 'other' top-1."""
    return [
        "dense" if i < steps.first_compared else ("same" if agree else "other")
        for i, agree in enumerate(np.asarray(steps.agreement, dtype=bool))
    ]


def _legend(with_dense: bool) -> str:
    def key(rgb: tuple[int, int, int], text: str) -> str:
        return f'<span style="color: rgb{rgb}">■</span> {text}'

    keys = [
        key(KL_BRUSH, "KL(dense ‖ compressed)"),
        key(AGREE_BRUSH, "same top-1"),
        key(DISAGREE_BRUSH, "other"),
    ]
    if with_dense:
        keys.append(key(DENSE_BRUSH, "from the dense prefill"))
    keys.append('<span style="color: rgb(255, 120, 90)">┆</span> first divergence')
    return " &nbsp;".join(keys)


class TokenStrip(QWidget):
    """KL bars over top-1 agreement cells, one column per generated token; fed plain data (TokenSteps)."""

    tokenHovered = Signal(int)  # noqa: N815 (generated-token index; -1 when the mouse leaves)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("tokenStrip")
        self._steps: TokenSteps | None = None
        self._hovered = -1
        self._cells: list[str] = []
        self._build_ui()

    def _build_ui(self) -> None:
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setObjectName("tokenStripGraphics")
        self.graphics.setMinimumHeight(100)
        self.graphics.ci.setSpacing(0)
        self._axis = TokenAxis()
        self.klPlot = self.graphics.addPlot(row=0, col=0, axisItems={"left": ScientificAxis("left")})
        self.agreePlot = self.graphics.addPlot(row=1, col=0, axisItems={"bottom": self._axis})
        self.graphics.ci.layout.setRowStretchFactor(0, 3)
        self.graphics.ci.layout.setRowStretchFactor(1, 1)
        for plot in (self.klPlot, self.agreePlot):
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.getAxis("left").setWidth(_AXIS_WIDTH)
            plot.setMouseEnabled(x=True, y=False)
        self.klPlot.setLabel("left", "KL")
        self.klPlot.getAxis("bottom").setStyle(showValues=False)
        self.agreePlot.setXLink(self.klPlot)
        self.agreePlot.setYRange(0, 1, padding=0)
        self.agreePlot.getAxis("left").setTicks([[(0.5, "top-1")]])
        self.klBars = pg.BarGraphItem(x0=[], x1=[], height=[], brush=KL_BRUSH, pen=None)
        self.agreeBars = pg.BarGraphItem(x0=[], x1=[], y0=[], height=[], brushes=[], pen=None)
        self.klPlot.addItem(self.klBars)
        self.agreePlot.addItem(self.agreeBars)
        self.divergenceLines = []
        self.hoverRegions = []
        for plot in (self.klPlot, self.agreePlot):
            line = pg.InfiniteLine(angle=90, movable=False, pen=DIVERGENCE_PEN)
            line.setZValue(10)
            line.setVisible(False)
            plot.addItem(line)
            self.divergenceLines.append(line)
            region = pg.LinearRegionItem((0, 1), movable=False, brush=HOVER_BRUSH, pen=pg.mkPen(None))
            region.setZValue(-10)
            region.setVisible(False)
            plot.addItem(region)
            self.hoverRegions.append(region)
        self.divergenceLines[0].label = pg.InfLineLabel(
            self.divergenceLines[0], "first divergence", position=0.9, color=(255, 120, 90)
        )

        self.legendLabel = QLabel(_legend(False), objectName="tokenStripLegend")
        self.exportButton = QPushButton("Export plot…", objectName="tokenStripExportButton")
        self.exportButton.setToolTip("Save the per-token strip as PNG or SVG")
        self.top5Label = QLabel(_HINT, objectName="tokenStripTop5")
        self.top5Label.setTextFormat(Qt.TextFormat.RichText)
        self.top5Label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.top5Label.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.top5Label.setFixedWidth(240)  # a fixed width: the plot must not move under the mouse
        self.top5Label.setWordWrap(True)

        self.legendLabel.setWordWrap(True)  # the legend wraps rather than widening the window
        title = QLabel("<b>Per token</b>")
        title.setToolTip("Teacher-forced on the dense continuation")
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(title)
        top.addWidget(self.legendLabel, 1)
        top.addWidget(self.exportButton)
        body = QHBoxLayout()
        body.setContentsMargins(0, 0, 0, 0)
        body.addWidget(self.graphics, 1)
        body.addWidget(self.top5Label)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addLayout(body, 1)
        self.graphics.scene().sigMouseMoved.connect(self._on_mouse_moved)

    # -- public API -------------------------------------------------------------------------------

    def set_steps(self, steps: TokenSteps | None) -> None:
        """Show per-token values (None: nothing regenerated yet)."""
        self._steps = steps
        n = 0 if steps is None else len(steps.tokens)
        x0 = np.arange(n, dtype=float)
        kl = np.zeros(0) if steps is None else np.asarray(steps.kl, dtype=float)
        self._cells = [] if steps is None else _cells(steps)
        self.klBars.setOpts(x0=x0 + 0.1, x1=x0 + 0.9, height=kl)
        self.agreeBars.setOpts(
            x0=x0 + 0.05,
            x1=x0 + 0.95,
            y0=np.full(n, 0.1),
            height=np.full(n, 0.8),
            brushes=[pg.mkBrush(CELL_BRUSHES[c]) for c in self._cells],
        )
        self.legendLabel.setText(_legend("dense" in self._cells))
        self._axis.tokens = [] if steps is None else list(steps.tokens)
        div = None if steps is None else steps.first_divergence
        for line in self.divergenceLines:
            line.setVisible(div is not None)
            if div is not None:
                line.setPos(div + 0.5)
        finite = kl[np.isfinite(kl)]
        self.klPlot.setYRange(0, float(finite.max()) * 1.05 if finite.size and finite.max() > 0 else 1.0)
        # Limits first: the old ones (one column before any data) would clamp the new range onto token 0.
        self.klPlot.setLimits(xMin=0, xMax=max(n, 1))
        self.klPlot.setXRange(0, max(n, 1), padding=0)
        self._axis.picture = None
        self._axis.update()
        self._set_hovered(self._hovered if 0 <= self._hovered < n else -1, force=True)

    def steps(self) -> TokenSteps | None:
        return self._steps

    def plotted_kl(self) -> np.ndarray:
        """The bar heights drawn, one per generated token."""
        return np.asarray(self.klBars.opts["height"], dtype=float)

    def plotted_cells(self) -> list[str]:
        """What each agreement cell is drawn as, read back from its colour: 'same', 'other' or 'dense'."""
        by_colour = {pg.mkBrush(rgb).color().rgb(): name for name, rgb in CELL_BRUSHES.items()}
        return [by_colour[b.color().rgb()] for b in self.agreeBars.opts["brushes"] or []]

    def divergence_marker(self) -> int | None:
        """The generated-token index the first-divergence marker sits on, or None when hidden."""
        line = self.divergenceLines[0]
        return math.floor(line.value()) if line.isVisible() else None

    def hovered(self) -> int:
        """The generated-token index under the mouse, or -1."""
        return self._hovered

    def top5_rows(self, index: int) -> list[tuple[str, float, str, float]]:
        """Rank by rank: (dense token, probability, compressed token, probability) at generated token `index`."""
        s = self._steps
        if s is None or not 0 <= index < len(s.tokens):
            return []
        return [
            (s.dense_top_texts[index][k], float(s.dense_top_probs[index][k]),
             s.compressed_top_texts[index][k], float(s.compressed_top_probs[index][k]))
            for k in range(len(s.dense_top_texts[index]))
        ]  # fmt: skip

    def export_image(self, path: str | os.PathLike[str], width: int | None = None) -> None:
        """Write both rows with their axes to PNG or SVG (by suffix), atomically; the hover band is left out."""
        shown = [region.isVisible() for region in self.hoverRegions]
        for region in self.hoverRegions:
            region.setVisible(False)
        try:
            export_graphics(self.graphics.ci, path, width)
        finally:
            for region, visible in zip(self.hoverRegions, shown, strict=True):
                region.setVisible(visible)

    def has_data(self) -> bool:
        return self._steps is not None and len(self._steps.tokens) > 0

    # -- internals --------------------------------------------------------------------------------

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        self._set_hovered(self._column_at(scene_pos))

    def _column_at(self, scene_pos: QPointF) -> int:
        n = 0 if self._steps is None else len(self._steps.tokens)
        for plot in (self.klPlot, self.agreePlot):
            if plot.vb.sceneBoundingRect().contains(scene_pos):
                col = math.floor(plot.vb.mapSceneToView(scene_pos).x())
                return col if 0 <= col < n else -1
        return -1

    def _set_hovered(self, index: int, force: bool = False) -> None:
        if index == self._hovered and not force:
            return
        self._hovered = index
        for region in self.hoverRegions:
            region.setVisible(index >= 0)
            if index >= 0:
                region.setRegion((index, index + 1))
        self.top5Label.setText(self._top5_html(index) if index >= 0 else _HINT)
        self.tokenHovered.emit(index)

    def _top5_html(self, index: int) -> str:
        s = self._steps
        cell = {"same": "same top-1", "other": "other top-1", "dense": "from the dense prefill"}
        head = (
            f"<b>token {index}</b> {html.escape(token_label(s.tokens[index], 24))} · "
            f"KL {float(s.kl[index]):.4g} · {cell[self._cells[index]]}"
        )
        rows = "".join(
            f"<tr><td>{html.escape(token_label(dt, 16))}</td><td align=right>{_percent(dp)}</td>"
            f"<td>&nbsp;&nbsp;</td><td>{html.escape(token_label(ct, 16))}</td>"
            f"<td align=right>{_percent(cp)}</td></tr>"
            for dt, dp, ct, cp in self.top5_rows(index)
        )
        return (
            f"{head}<table><tr><th align=left>dense</th><th></th><th></th>"
            f"<th align=left>compressed</th><th></th></tr>{rows}</table>"
        )
