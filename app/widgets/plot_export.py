"""PNG and SVG export of a pyqtgraph layout, shared by every plot (heatmap, frontier)."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from pathlib import Path

from pyqtgraph.exporters import ImageExporter, SVGExporter
from PySide6.QtCore import QBuffer, QIODevice
from PySide6.QtGui import QImage

from kvcore.atomic import write_bytes

IMAGE_SUFFIXES = (".png", ".svg")
IMAGE_FILTER = "PNG image (*.png);;SVG image (*.svg)"
#: A PNG's width when the user picks none: large enough for a slide or a paper figure.
DEFAULT_EXPORT_WIDTH = 1600
#: A PNG is laid out at its width / PIXEL_RATIO (at least the size shown), then drawn at PIXEL_RATIO: labels keep a
#: readable size and are laid out whole, however small the plot is on screen.
PIXEL_RATIO = 2.0
#: The least height / width of a laid-out export (a short on-screen strip still gets room for its axis labels).
MIN_ASPECT = 0.5


@contextlib.contextmanager
def _laid_out(item, width: float) -> Iterator[None]:  # noqa: ANN001 (a pyqtgraph GraphicsWidget)
    """Lay `item` out at `width` logical pixels (its aspect ratio kept, at least MIN_ASPECT) while exporting."""
    old = item.geometry()
    if old.width() <= 0 or old.height() <= 0:
        yield
        return
    aspect = max(old.height() / old.width(), MIN_ASPECT)
    item.resize(width, width * aspect)
    item.layout.activate()
    try:
        yield
    finally:
        item.setGeometry(old)
        item.layout.activate()


@contextlib.contextmanager
def _svg_closed_paths_tolerated() -> Iterator[None]:
    """pyqtgraph 0.14's SVG exporter cannot parse the "Z" that Qt 6.12 ends closed paths with
    (pyqtgraph issue 3495), and every clipped ViewBox makes one; drop those tokens while exporting."""
    module = importlib.import_module("pyqtgraph.exporters.SVGExporter")
    original = module.correctCoordinates

    def correct(node, defs, item, options):  # noqa: ANN001 (pyqtgraph's private signature)
        for path in node.getElementsByTagName("path"):
            tokens = path.getAttribute("d").split()
            if "Z" in tokens or "z" in tokens:
                path.setAttribute("d", " ".join(t for t in tokens if t not in ("Z", "z")))
        return original(node, defs, item, options)

    module.correctCoordinates = correct
    try:
        yield
    finally:
        module.correctCoordinates = original


def export_graphics(item, path: str | os.PathLike[str], width: int | None = None) -> None:  # noqa: ANN001
    """Write a pyqtgraph item (a GraphicsLayout, a PlotItem) to PNG or SVG by suffix, atomically.

    `width` scales a PNG to that many pixels wide (default DEFAULT_EXPORT_WIDTH; the height follows the item's
    aspect ratio, and every label scales with it). An SVG is vector and has no width.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in IMAGE_SUFFIXES:
        raise ValueError(f"Export as .png or .svg, not '{suffix or 'no suffix'}'")
    if suffix == ".png":
        pixels = int(width or DEFAULT_EXPORT_WIDTH)
        with _laid_out(item, max(pixels / PIXEL_RATIO, item.geometry().width())):
            exporter = ImageExporter(item)
            exporter.parameters()["width"] = pixels
            data = _png_bytes(exporter.export(toBytes=True))
    else:
        with _svg_closed_paths_tolerated():
            data = SVGExporter(item).export(toBytes=True)
    if not data:
        raise OSError(f"Nothing was drawn for {path}")
    write_bytes(path, data)  # drawn in memory first: a full disk is Python's OSError naming the file


def _png_bytes(image: QImage) -> bytes:
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    if not image.save(buffer, "PNG"):
        raise OSError("Could not encode the PNG image")
    return bytes(buffer.data())


def with_image_suffix(path: str, chosen_filter: str) -> str:
    """A save dialog's path with the chosen filter's suffix added when the user typed none."""
    if Path(path).suffix:
        return path
    return path + (".svg" if "svg" in chosen_filter.lower() else ".png")
