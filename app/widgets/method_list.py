"""What the Sweep and Needle grid docks share: a method list with a tick box each, and their layout."""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QSplitter,
    QVBoxLayout,
    QWidget,
)


class MethodChecklist(QListWidget):
    """`methods` in order, the `checked` ones ticked."""

    def __init__(
        self, methods: Iterable[str], checked: Iterable[str], object_name: str, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent, objectName=object_name)
        self.setToolTip("Methods to run (tick several)")
        for name in methods:
            item = QListWidgetItem(name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            self.addItem(item)
        self.set_checked(list(checked))

    def checked(self) -> list[str]:
        items = (self.item(i) for i in range(self.count()))
        return [it.text() for it in items if it.checkState() == Qt.CheckState.Checked]

    def set_checked(self, names: list[str]) -> None:
        for i in range(self.count()):
            item = self.item(i)
            item.setCheckState(Qt.CheckState.Checked if item.text() in names else Qt.CheckState.Unchecked)


def run_layout(
    owner: QWidget,
    rows: list[tuple[str, QWidget]],
    run: QWidget,
    cancel: QWidget,
    progress: QWidget,
    status: QWidget,
    footer: list[QWidget],
    view: QWidget,
) -> None:
    """The layout both run docks share: a form of inputs, Run / Cancel, progress and status, the export buttons
    at the bottom of that column, and the result view to its right (a splitter between them)."""
    form = QFormLayout()
    for label, widget in rows:
        form.addRow(label, widget)
    left = QWidget()
    column = QVBoxLayout(left)
    column.setContentsMargins(0, 0, 0, 0)
    column.addLayout(form)
    column.addLayout(_row(run, cancel))
    column.addWidget(progress)
    column.addWidget(status)
    column.addStretch(1)
    column.addLayout(_row(*footer))
    splitter = QSplitter(Qt.Orientation.Horizontal)
    splitter.addWidget(left)
    splitter.addWidget(view)
    splitter.setStretchFactor(1, 3)
    layout = QVBoxLayout(owner)
    layout.setContentsMargins(2, 2, 2, 2)
    layout.addWidget(splitter)


def _row(*widgets: QWidget) -> QHBoxLayout:
    row = QHBoxLayout()
    for w in widgets:
        row.addWidget(w)
    return row
