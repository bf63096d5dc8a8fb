"""One way every plot widget shows its hover text: as the graphics view's tooltip, at the cursor at once."""

from __future__ import annotations

from PySide6.QtGui import QCursor
from PySide6.QtWidgets import QToolTip, QWidget


def show_hover(graphics: QWidget, text: str) -> None:
    """Set `text` as `graphics`' tooltip and show it at the cursor now (an empty text only clears it): Qt's own
    tooltip waits for the mouse to rest, which a moving hover never does."""
    graphics.setToolTip(text)
    if text:
        QToolTip.showText(QCursor.pos(), text, graphics)
