"""The window fits a 13-inch laptop (1280×800) in every state; a geometry saved on a bigger screen is clamped to the
one it opens on; View ▸ Reset Layout puts every dock back; no axis scales its values by an SI prefix; the
per-token plot shows every token after a prefill and after Generate."""

from __future__ import annotations

import pyqtgraph as pg
import pytest
from PySide6.QtCore import QRect, Qt
from PySide6.QtWidgets import QApplication

from app.settings import Settings
from app.window.layout import LAPTOP_SIZE, RESET_LAYOUT_SHORTCUT, clamped
from app.window.main_window import MainWindow
from tests.app.waiting import wait_until
from tests.app.windows import window_and_reference

TOKENS = 6
LONG_CONTINUATION = 120


def _fits(window: MainWindow, state: str) -> tuple[int, int]:
    QApplication.processEvents()
    hint = window.minimumSizeHint().expandedTo(window.minimumSize())
    assert hint.width() <= LAPTOP_SIZE[0] and hint.height() <= LAPTOP_SIZE[1], (state, hint.toTuple())
    print(f"minimum size {state}: {hint.width()}×{hint.height()}")
    return hint.toTuple()


@pytest.fixture(scope="module")
def window(qapp, model_dirs, tmp_path_factory):
    window, _ = window_and_reference(model_dirs, tmp_path_factory.mktemp("settings") / "s.json", TOKENS)
    window.resize(*LAPTOP_SIZE)
    yield window
    window.close()
    QApplication.processEvents()


def test_a_fresh_window_fits_a_laptop_screen(qapp, tmp_path):
    fresh = MainWindow(model=None, settings_path=tmp_path / "s.json")
    fresh.show()
    _fits(fresh, "fresh")
    fresh.close()


def test_the_window_fits_a_laptop_screen_in_every_state(window):
    _fits(window, "after prefill")
    strip = window.comparison.strip
    assert strip.klPlot.vb.viewRange()[0] == pytest.approx([0, TOKENS]), "every token in view after prefill"

    panel = window.sweepPanel
    panel.set_methods(["snapkv", "streaming_llm", "pyramidkv"])
    panel.ratiosEdit.setText("0.25,0.5")
    panel.bitsEdit.setText("16")
    window.sweeping.run()
    wait_until(lambda: window.sweeping.running)
    _fits(window, "sweep running")
    wait_until(lambda: not window.sweeping.running, timeout=300)
    assert window.sweeping.points()
    _fits(window, "sweep finished")

    needles = window.needlePanel
    needles.depthsEdit.setText("0.5")
    needles.lengthsEdit.setText("96")
    needles.set_methods(["snapkv", "streaming_llm", "h2o", "knorm", "random"])
    needles.ratiosEdit.setText("0.5")
    window.needles.run()
    wait_until(lambda: not window.needles.running, timeout=300)
    grid = needles.grid
    assert len(grid.state()) == 6
    _fits(window, "needle grid")
    # Every panel can be seen: they wrap to the dock's width and scroll down, none is cut off at the side.
    assert grid.scrollArea.widget() is grid.graphics and grid.columns() < 6
    assert grid.graphics.minimumWidth() >= grid.columns() * grid.panel_width()
    assert grid.columns() == 1 or grid.graphics.minimumWidth() <= grid.scrollArea.viewport().width()

    assert window.pinning.pin()
    _fits(window, "pinned")

    assert window.generate(LONG_CONTINUATION) is not None
    wait_until(lambda: len(strip.plotted_kl()) >= TOKENS + LONG_CONTINUATION, timeout=300)
    _fits(window, "long continuation")
    n = len(strip.plotted_kl())
    assert strip.klPlot.vb.viewRange()[0] == pytest.approx([0, n]), "every token in view after Generate"


def test_reset_layout_shows_and_docks_every_panel(window):
    action = window.actions_.reset_layout
    assert action.shortcut().toString() == RESET_LAYOUT_SHORTCUT
    window.statsDock.hide()
    window.sessionDock.setFloating(True)
    window.removeDockWidget(window.metricsDock)
    action.trigger()
    QApplication.processEvents()
    for dock in window.docks():
        assert not dock.isHidden() and not dock.isFloating(), dock.windowTitle()
    assert window.dockWidgetArea(window.sessionDock) == Qt.DockWidgetArea.LeftDockWidgetArea
    assert window.dockWidgetArea(window.metricsDock) == Qt.DockWidgetArea.RightDockWidgetArea
    below = {
        window.comparisonDock,
        window.sweepDock,
        window.needleDock,
        window.questionsDock,
        window.timelineDock,
        window.storedDock,
    }
    assert set(window.tabifiedDockWidgets(window.statsDock)) == below
    assert not window.comparisonDock.visibleRegion().isEmpty(), "the continuations are in front"


def test_a_saved_geometry_larger_than_the_screen_is_clamped(qapp, tmp_path):
    big = MainWindow(model=None, settings_path=tmp_path / "big.json")
    big.setMinimumSize(1, 1)
    big.setGeometry(-500, -300, 4000, 3000)
    path = tmp_path / "s.json"
    Settings(path=path, geometry=bytes(big.saveGeometry().toBase64().data()).decode("ascii")).save()
    big.close()
    window = MainWindow(model=None, settings_path=path)
    window.show()
    QApplication.processEvents()
    screen = window.screen().availableGeometry()
    assert screen.contains(window.frameGeometry()), (window.frameGeometry(), screen)
    window.close()


def test_clamped_keeps_a_fitting_frame_and_pulls_others_inside():
    screen = QRect(0, 0, 1280, 800)
    assert clamped(QRect(10, 20, 600, 400), screen) == QRect(10, 20, 600, 400)
    assert clamped(QRect(-50, -50, 3000, 2000), screen) == screen
    assert clamped(QRect(1000, 700, 600, 400), screen) == QRect(680, 400, 600, 400)


def test_no_axis_scales_its_values_by_an_si_prefix(window):
    strip, heatmap, frontier = window.comparison.strip, window.heatmap, window.sweepPanel.frontier
    axes = [
        strip.klPlot.getAxis("left"),
        strip.agreePlot.getAxis("bottom"),
        heatmap.plot.getAxis("bottom"),
        heatmap.plot.getAxis("left"),
        heatmap.colorBar.axis,
        frontier.plot.getAxis("left"),
    ]
    for axis in axes:
        assert isinstance(axis, pg.AxisItem) and not axis.autoSIPrefix, axis.orientation
    strip.klPlot.setYRange(0, 0.0004, padding=0)
    QApplication.processEvents()
    axis = strip.klPlot.getAxis("left")
    texts = axis.tickStrings([0.0001, 0.0002], 1.0, 0.0001)
    assert texts == ["0.0001", "0.0002"] and axis.labelText == "KL" and axis.labelUnitPrefix == ""
