"""The Sweep and Needle grid panels read whole: every method name, the ratio lists from their start, the frontier's
legend beside its data, and every needle-grid panel reachable by scrolling, none squeezed below a readable size."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.widgets.needle_grid import PANEL_SIZE
from app.widgets.needle_panel import NeedlePanel
from app.widgets.sweep_panel import SweepPanel


def test_method_names_and_ratio_lists_are_whole(qapp):
    panel = SweepPanel()
    panel.resize(700, 300)
    panel.show()
    QApplication.processEvents()
    names = panel.methodsList
    widest = max(names.fontMetrics().horizontalAdvance(names.item(i).text()) for i in range(names.count()))
    assert names.width() >= widest + 40, "every method name fits beside its tick box"
    ratios = panel.ratiosEdit
    assert ratios.cursorPosition() == 0
    assert ratios.width() >= ratios.fontMetrics().horizontalAdvance(ratios.text())
    panel.close()


def test_the_frontier_legend_is_beside_the_data(qapp):
    panel = SweepPanel()
    panel.resize(900, 400)
    panel.show()
    QApplication.processEvents()
    plot = panel.frontier.plot
    legend = panel.frontier.legend
    assert legend.parentItem() is not plot.vb
    assert legend.sceneBoundingRect().left() >= plot.vb.sceneBoundingRect().right() - 1, "right of the data"
    panel.close()


def test_every_needle_panel_keeps_a_readable_size_and_scrolls(qapp):
    panel = NeedlePanel()
    panel.resize(1000, 250)
    panel.show()
    grid = panel.grid
    grid.set_grid([f"streaming_llm {i} % · 16-bit" for i in range(7)], [0.1, 0.5, 0.9], [96, 192])
    QApplication.processEvents()
    columns = grid.columns()
    room = grid.scrollArea.width() - grid.scrollArea.verticalScrollBar().sizeHint().width()
    assert grid.panel_width() >= PANEL_SIZE[0]
    assert columns == max(1, room // grid.panel_width()) < 7, "panels wrap to the width"
    assert grid.graphics.minimumWidth() <= grid.scrollArea.viewport().width(), "no panel cut off at the side"
    rows = -(-7 // columns)
    assert grid.graphics.minimumWidth() >= columns * grid.panel_width()
    ci = grid.graphics.ci
    assert ci.effectiveSizeHint(Qt.SizeHint.MinimumSize).width() <= grid.graphics.minimumWidth(), (
        "no panel cut off"
    )
    assert grid.graphics.minimumHeight() >= rows * PANEL_SIZE[1], "the rows below scroll into view"
    assert grid.scrollArea.widget() is grid.graphics and grid.scrollArea.widgetResizable()
    panel.resize(1600, 250)
    QApplication.processEvents()
    assert grid.columns() > columns, "a wider view holds more panels per row"
    first = grid.cell_scene_position(6, 1, 2)
    assert grid.cell_at(first) == (6, 1, 2), "cells are found after the panels move"
    panel.close()


def test_the_frontier_auto_ranges_when_its_points_change(qapp):
    panel = SweepPanel()
    panel.resize(900, 400)
    panel.show()
    frontier = panel.frontier
    frontier.plot.setXRange(500, 600)  # a user's zoom, away from any data
    assert not frontier.plot.vb.autoRangeEnabled()[0]
    frontier.set_metric("agreement")
    assert frontier.plot.vb.autoRangeEnabled()[0], "a new metric shows every point again"
    panel.close()
