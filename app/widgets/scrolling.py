"""A scroll area for content that may be larger than the space it gets: a laptop screen scrolls a panel instead
of widening the window."""

from __future__ import annotations

from PySide6.QtWidgets import QFrame, QScrollArea, QWidget


def scrolled(widget: QWidget) -> QScrollArea:
    """`widget` in a frameless scroll area that resizes it: it fills the area, and scrolls once the area is smaller
    than the widget's minimum."""
    area = QScrollArea(objectName=f"{widget.objectName() or 'content'}Scroll")
    area.setWidget(widget)
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    return area
