"""`kvlens sweep --plot frontier.png`: the app's own frontier widget drawn headless to PNG or SVG.

kvcore stays Qt-free: the `kvlens` entry point (app.__main__) hands `write_frontier` to kvcore.cli.main, and Qt is
imported only when a plot is asked for. Drawing with the widget the app shows makes the file and the window
agree by construction; without a display Qt's offscreen platform is used.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from kvcore.engine.sweep import SweepPoint

#: Size of the headless frontier image, in pixels.
PLOT_SIZE = (1000, 640)


def _needs_offscreen() -> bool:
    return sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    )


def write_frontier(points: Sequence[SweepPoint], path: str | os.PathLike[str], metric: str) -> None:
    """Draw the frontier of `points` on `metric` (x = % of dense) and write it to `path` (.png or .svg)."""
    if _needs_offscreen():
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from app.widgets.frontier import FrontierPlot
    from app.widgets.plot_export import export_graphics

    app = QApplication.instance() or QApplication([])
    plot = FrontierPlot()
    plot.set_points(points)
    plot.set_metric(metric)
    plot.resize(*PLOT_SIZE)
    app.processEvents()
    export_graphics(plot.plot, Path(path), width=PLOT_SIZE[0])
    plot.deleteLater()
