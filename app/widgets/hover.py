"""One way every plot widget shows its hover text: as the graphics view's tooltip, at the cursor at once, and for
the Stored form's views on a line under the plot."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QCursor
from PySide6.QtWidgets import QLabel, QSizePolicy, QToolTip, QWidget


def show_hover(graphics: QWidget, text: str) -> None:
    """Set `text` as `graphics`' tooltip and show it at the cursor now (an empty text only clears it): Qt's own
    tooltip waits for the mouse to rest, which a moving hover never does."""
    graphics.setToolTip(text)
    if text:
        QToolTip.showText(QCursor.pos(), text, graphics)


class HoverLine(QLabel):
    """The line under a view that repeats its hover text (selectable, for copying), or `hint` when nothing is
    hovered; a long line is cut at the dock's edge rather than widening the window."""

    def __init__(self, hint: str, object_name: str) -> None:
        super().__init__(hint, objectName=object_name)
        self.hint = hint
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def show_text(self, graphics: QWidget, text: str) -> None:
        """`text` as `graphics`' tooltip at the cursor and on this line (the hint when empty)."""
        show_hover(graphics, text)
        self.setText(text or self.hint)
