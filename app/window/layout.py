"""Where the docks sit and how small the window may get: it must fit a 13-inch laptop (1280×800) in every state.

The heatmap is the subject: it keeps the centre and the space the docks give up. Session on the left and
Compression over Metrics on the right are always in view; the seven wide views below (Continuations, Statistics,
Sweep, Needle grid, Questions, Timeline, Stored form) share one tabbed row the width of the heatmap and the Session panel, so each gets all of it.
Every dock's content scrolls rather than widening the window.
"""

from __future__ import annotations

from typing import Protocol

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QGuiApplication, QScreen
from PySide6.QtWidgets import QDockWidget, QMainWindow, QWidget

#: The laptop screen the window must fit (a 13" MacBook Air is 1470×956 points; 1280×800 leaves room to spare).
LAPTOP_SIZE = (1280, 800)
#: Default widths of the left (Session) and right (Compression, Metrics) columns, and the bottom row's height.
SIDE_WIDTHS = (300, 290)
BOTTOM_HEIGHT = 300
RESET_LAYOUT_SHORTCUT = "Ctrl+Shift+L"


class DockedWindow(Protocol):
    """The docks a layout places (MainWindow has them)."""

    sessionDock: QDockWidget
    controlsDock: QDockWidget
    metricsDock: QDockWidget
    comparisonDock: QDockWidget
    statsDock: QDockWidget
    sweepDock: QDockWidget
    needleDock: QDockWidget
    questionsDock: QDockWidget
    timelineDock: QDockWidget
    storedDock: QDockWidget

    @property
    def widget(self) -> QMainWindow: ...


def arrange_docks(owner: DockedWindow) -> None:
    """The default layout: Session left, Compression over Metrics right (full height), Continuations, Statistics,
    Sweep, Needle grid, Questions, Timeline and Stored form tabbed below (Continuations in front); every dock shown and docked. Also View ▸ Reset
    Layout."""
    window = owner.widget
    left, right, bottom = (
        Qt.DockWidgetArea.LeftDockWidgetArea,
        Qt.DockWidgetArea.RightDockWidgetArea,
        Qt.DockWidgetArea.BottomDockWidgetArea,
    )
    placed = [
        (owner.sessionDock, left),
        (owner.controlsDock, right),
        (owner.metricsDock, right),
        (owner.comparisonDock, bottom),
        (owner.statsDock, bottom),
        (owner.sweepDock, bottom),
        (owner.needleDock, bottom),
        (owner.questionsDock, bottom),
        (owner.timelineDock, bottom),
        (owner.storedDock, bottom),
    ]
    for dock, area in placed:
        dock.setFloating(False)
        window.addDockWidget(area, dock)
        dock.show()
    window.splitDockWidget(owner.controlsDock, owner.metricsDock, Qt.Orientation.Vertical)
    window.tabifyDockWidget(owner.comparisonDock, owner.statsDock)
    window.tabifyDockWidget(owner.statsDock, owner.sweepDock)
    window.tabifyDockWidget(owner.sweepDock, owner.needleDock)
    window.tabifyDockWidget(owner.needleDock, owner.questionsDock)
    window.tabifyDockWidget(owner.questionsDock, owner.timelineDock)
    window.tabifyDockWidget(owner.timelineDock, owner.storedDock)
    owner.comparisonDock.raise_()
    window.setCorner(Qt.Corner.BottomLeftCorner, bottom)
    window.setCorner(Qt.Corner.BottomRightCorner, right)
    size_docks(owner)


def size_docks(owner: DockedWindow) -> None:
    """The default widths and heights (again once the window is shown: before that Qt sizes against a guess)."""
    window = owner.widget
    window.resizeDocks([owner.sessionDock, owner.controlsDock], list(SIDE_WIDTHS), Qt.Orientation.Horizontal)
    window.resizeDocks([owner.comparisonDock], [BOTTOM_HEIGHT], Qt.Orientation.Vertical)
    window.resizeDocks([owner.controlsDock, owner.metricsDock], [430, 300], Qt.Orientation.Vertical)


def screen_of(window: QWidget) -> QScreen | None:
    """The screen the window's centre is on, else its own, else the primary one."""
    return (
        QGuiApplication.screenAt(window.frameGeometry().center())
        or window.screen()
        or QGuiApplication.primaryScreen()
    )


def clamped(frame: QRect, available: QRect) -> QRect:
    """`frame` made no larger than `available` and moved inside it."""
    width, height = min(frame.width(), available.width()), min(frame.height(), available.height())
    x = min(max(frame.x(), available.x()), available.right() + 1 - width)
    y = min(max(frame.y(), available.y()), available.bottom() + 1 - height)
    return QRect(x, y, width, height)


def clamp_to_screen(window: QWidget) -> None:
    """Shrink and move the window so it lies whole on the screen it opens on (a geometry saved on a larger screen
    would otherwise open off its edges)."""
    screen = screen_of(window)
    if screen is None:
        return
    frame = window.frameGeometry()
    extra_w, extra_h = frame.width() - window.width(), frame.height() - window.height()
    fit = clamped(frame, screen.availableGeometry())
    if fit != frame:
        window.resize(max(1, fit.width() - extra_w), max(1, fit.height() - extra_h))
        window.move(fit.topLeft())
