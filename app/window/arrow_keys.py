"""Plain arrow keys belong to the widget that has focus (slider, editor, list); elsewhere they are shortcuts.

The window binds Right to Step. Qt gives a window shortcut priority over a focused slider or spin box, so
without this filter Right would step the session instead of moving the slider the user is dragging.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QAbstractSlider,
    QAbstractSpinBox,
    QComboBox,
    QLineEdit,
    QPlainTextEdit,
    QTextEdit,
    QWidget,
)

_ARROWS = {Qt.Key.Key_Left, Qt.Key.Key_Right, Qt.Key.Key_Up, Qt.Key.Key_Down}
_PLAIN = {Qt.KeyboardModifier.NoModifier, Qt.KeyboardModifier.KeypadModifier}
_EDITABLE_TYPES = (
    QAbstractSlider,
    QAbstractSpinBox,
    QComboBox,
    QLineEdit,
    QPlainTextEdit,
    QTextEdit,
    QAbstractItemView,
)


class ArrowKeyGuard(QObject):
    """Accepts ShortcutOverride for unmodified arrow keys, so the focused widget receives them."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt API)
        if (
            event.type() == QEvent.Type.ShortcutOverride
            and isinstance(event, QKeyEvent)
            and event.key() in _ARROWS
            and event.modifiers() in _PLAIN
        ):
            event.accept()
            return True
        return False

    def protect(self, root: QWidget) -> None:
        """Install on every widget under `root` that uses arrow keys itself (read-only text views do not)."""
        for widget in root.findChildren(QWidget):
            read_only = isinstance(widget, QPlainTextEdit | QTextEdit) and widget.isReadOnly()
            if isinstance(widget, _EDITABLE_TYPES) and not read_only:
                widget.installEventFilter(self)
