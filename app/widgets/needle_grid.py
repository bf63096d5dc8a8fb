"""The needle-in-a-haystack heatmap: one small depth × length grid per cache (dense first, then each
configuration), green where the probe's value was recalled, red where not, grey while still to run.

Clicking a cell emits `cellClicked(panel, length_index, depth_index)`; the window opens that prompt and cache.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from app.widgets.plot_export import export_graphics
from app.widgets.scrolling import scrolled

RECALLED = (46, 160, 67, 255)
MISSED = (215, 58, 73, 255)
PENDING = (200, 200, 200, 255)
#: At most this many panels per row; within that, as many as the view's width holds (the rest wrap below).
MAX_COLUMNS = 5
#: The least space a panel gets (more when its title needs it); a smaller view scrolls instead of cutting panels off.
PANEL_SIZE = (210, 170)


class NeedleGridView(QWidget):
    """Panels of [lengths × depths] cells; depth 0 (needle at the start) at the top, as the usual plots show."""

    cellClicked = Signal(int, int, int)  # noqa: N815 (Qt signal naming): panel, length index, depth index
    hoverInfo = Signal(str)  # noqa: N815

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("needleGridView")
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setObjectName("needleGridGraphics")
        self.graphics.setBackground("w")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.scrollArea = scrolled(self.graphics)
        layout.addWidget(self.scrollArea)
        self._titles: list[str] = []
        self._depths: list[float] = []
        self._lengths: list[int] = []
        self._state = np.zeros(
            (0, 0, 0), dtype=np.int8
        )  # [panel, length, depth]: -1 pending, 0 missed, 1 hit
        self._plots: list[pg.PlotItem] = []
        self._images: list[pg.ImageItem] = []
        self._columns = 0
        self._panel_width = PANEL_SIZE[0]
        self.graphics.scene().sigMouseClicked.connect(self._on_click)
        self.graphics.scene().sigMouseMoved.connect(self._on_move)

    def titles(self) -> list[str]:
        """The panels' titles, in order ('dense' first)."""
        return list(self._titles)

    def set_grid(self, titles: Sequence[str], depths: Sequence[float], lengths: Sequence[int]) -> None:
        """Lay out one empty (pending) panel per title."""
        self._titles, self._depths, self._lengths = list(titles), list(depths), list(lengths)
        self._state = np.full((len(titles), len(lengths), len(depths)), -1, dtype=np.int8)
        self.graphics.clear()
        self._plots, self._images = [], []
        self._panel_width = PANEL_SIZE[0]
        self._columns = 1
        for i, title in enumerate(titles):
            plot = self.graphics.addPlot(row=i // self._columns, col=i % self._columns, title=title)
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            plot.invertY(True)
            plot.getAxis("bottom").setTicks([[(j + 0.5, str(n)) for j, n in enumerate(lengths)]])
            plot.getAxis("left").setTicks([[(j + 0.5, f"{d:g}") for j, d in enumerate(depths)]])
            plot.setLabel("bottom", "prompt tokens")
            plot.setLabel("left", "needle depth")
            image = pg.ImageItem()
            plot.addItem(image)
            plot.setRange(xRange=(0, len(lengths)), yRange=(0, len(depths)), padding=0)
            self._plots.append(plot)
            self._images.append(image)
            self._paint(i)
        # A panel is as wide as its title and axes need: pyqtgraph would otherwise draw the row wider than the
        # view and cut the last panels off.
        needed = (p.effectiveSizeHint(Qt.SizeHint.MinimumSize).width() for p in self._plots)
        self._panel_width = max([PANEL_SIZE[0], *(math.ceil(w) for w in needed)])
        self._arrange(self._fitting_columns())

    def columns(self) -> int:
        """Panels per row now."""
        return self._columns

    def resizeEvent(self, event) -> None:  # noqa: ANN001, N802 (Qt API)
        super().resizeEvent(event)
        columns = self._fitting_columns()
        if self._plots and columns != self._columns:
            self._arrange(columns)

    def _arrange(self, columns: int) -> None:
        """Lay the panels out `columns` to a row."""
        if columns != self._columns:
            self._columns = columns
            for plot in self._plots:
                self.graphics.ci.removeItem(plot)
            for i, plot in enumerate(self._plots):
                self.graphics.ci.addItem(plot, row=i // columns, col=i % columns)
        self._set_minimum_size()

    def _fitting_columns(self) -> int:
        """As many panels per row as the width holds (at least one, at most MAX_COLUMNS and the panel count)."""
        n = max(1, len(self._titles))
        room = self.scrollArea.width() - self.scrollArea.verticalScrollBar().sizeHint().width()  # bar or not
        grid = self.graphics.ci.layout
        left, _, right, _ = grid.getContentsMargins()
        spacing = grid.horizontalSpacing()
        fit = int((room - left - right + spacing) // (self._panel_width + spacing))
        return max(1, min(MAX_COLUMNS, n, fit))

    def _set_minimum_size(self) -> None:
        """Room for every panel at a readable size: the view scrolls down to the rows that do not fit."""
        rows = max(1, math.ceil(len(self._plots) / max(1, self._columns)))
        grid = self.graphics.ci.layout
        grid.invalidate()
        least = self.graphics.ci.effectiveSizeHint(Qt.SizeHint.MinimumSize)  # titles, axes, margins, spacing
        self.graphics.setMinimumSize(
            max(self._columns * self._panel_width, math.ceil(least.width())),
            max(rows * PANEL_SIZE[1], math.ceil(least.height())),
        )

    def panel_width(self) -> int:
        """The width each panel is given at the least (its title and axes whole)."""
        return self._panel_width

    def set_cell(self, length_index: int, depth_index: int, recalled: Sequence[bool]) -> None:
        """One probe's result for every panel (recalled[i] for panel i)."""
        for panel, hit in enumerate(recalled):
            self._state[panel, length_index, depth_index] = int(bool(hit))
            self._paint(panel)

    def state(self) -> np.ndarray:
        """[panel, length, depth]: 1 recalled, 0 missed, -1 not run."""
        return self._state.copy()

    def has_data(self) -> bool:
        return bool((self._state >= 0).any())

    def export_image(self, path: str | os.PathLike[str], width: int | None = None) -> None:
        export_graphics(self.graphics.ci, path, width)

    def cell_scene_position(self, panel: int, length_index: int, depth_index: int) -> QPointF:
        return self._plots[panel].vb.mapViewToScene(QPointF(length_index + 0.5, depth_index + 0.5))

    def cell_widget_position(self, panel: int, length_index: int, depth_index: int):  # noqa: ANN201 (QPoint)
        return self.graphics.mapFromScene(self.cell_scene_position(panel, length_index, depth_index))

    def cell_at(self, scene_pos: QPointF) -> tuple[int, int, int] | None:
        for panel, plot in enumerate(self._plots):
            if plot.vb.sceneBoundingRect().contains(scene_pos):
                p = plot.vb.mapSceneToView(scene_pos)
                li, di = int(np.floor(p.x())), int(np.floor(p.y()))
                if 0 <= li < len(self._lengths) and 0 <= di < len(self._depths):
                    return panel, li, di
        return None

    def _paint(self, panel: int) -> None:
        rgba = np.empty((*self._state.shape[1:], 4), dtype=np.ubyte)
        cells = self._state[panel]
        rgba[cells == -1] = PENDING
        rgba[cells == 0] = MISSED
        rgba[cells == 1] = RECALLED
        self._images[panel].setImage(rgba, autoLevels=False, levels=(0, 255))

    def _on_click(self, event) -> None:  # noqa: ANN001 (pyqtgraph MouseClickEvent)
        if event.button() != Qt.MouseButton.LeftButton:
            return
        cell = self.cell_at(event.scenePos())
        if cell is not None:
            event.accept()
            self.cellClicked.emit(*cell)

    def _on_move(self, scene_pos: QPointF) -> None:
        cell = self.cell_at(scene_pos)
        if cell is None:
            self.hoverInfo.emit("")
            return
        panel, li, di = cell
        state = {-1: "not run yet", 0: "missed", 1: "recalled"}[int(self._state[panel, li, di])]
        self.hoverInfo.emit(
            f"{self._titles[panel]} · {self._lengths[li]} tokens · depth {self._depths[di]:g}: {state} "
            "(click to open this prompt and cache)"
        )
