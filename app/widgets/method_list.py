"""What the Sweep and Needle grid docks share: a method list with a tick box each, their controls and layout."""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.widgets.method_tip import method_tip
from app.widgets.scrolling import scrolled


class MethodChecklist(QListWidget):
    """`methods` in order, the `checked` ones ticked."""

    def __init__(
        self, methods: Iterable[str], checked: Iterable[str], object_name: str, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent, objectName=object_name)
        self.setToolTip("Methods to run (tick several)")
        for name in methods:
            item = QListWidgetItem(name)
            item.setToolTip(method_tip(name))
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            self.addItem(item)
        self.set_checked(list(checked))
        # Every name whole: the widest, its tick box and a scroll bar.
        widest = max(
            (self.fontMetrics().horizontalAdvance(self.item(i).text()) for i in range(self.count())),
            default=0,
        )
        self.setMinimumWidth(widest + 60)

    def checked(self) -> list[str]:
        items = (self.item(i) for i in range(self.count()))
        return [it.text() for it in items if it.checkState() == Qt.CheckState.Checked]

    def set_checked(self, names: list[str]) -> None:
        for i in range(self.count()):
            item = self.item(i)
            item.setCheckState(Qt.CheckState.Checked if item.text() in names else Qt.CheckState.Unchecked)


class RunPanel(QWidget):
    """What both run docks share: Run / Cancel, progress, a status line, Export CSV, the method list, and the
    layout (a form of inputs and those controls on the left, the result view to the right of a splitter).

    A subclass creates its inputs, then calls `_build`; object names start with its `prefix` (sweepRunButton).
    """

    runRequested = Signal()  # noqa: N815 (Qt signal naming)
    cancelRequested = Signal()  # noqa: N815
    exportCsvRequested = Signal()  # noqa: N815
    methodsList: MethodChecklist

    def _build(
        self,
        prefix: str,
        run_text: str,
        csv_tip: str,
        rows: list[tuple[str, QWidget]],
        extra_footer: list[QWidget],
        view: QWidget,
    ) -> QLabel:
        """Create the shared controls, lay everything out and connect the signals; returns the status label."""
        self.runButton = QPushButton(run_text, objectName=f"{prefix}RunButton")
        self.cancelButton = QPushButton("Cancel", objectName=f"{prefix}CancelButton")
        self.cancelButton.setEnabled(False)
        self.progressBar = QProgressBar(objectName=f"{prefix}ProgressBar")
        self.exportCsvButton = QPushButton("Export CSV…", objectName=f"{prefix}ExportCsvButton")
        self.exportCsvButton.setToolTip(csv_tip)
        status = QLabel("")
        status.setWordWrap(True)
        self.runButton.clicked.connect(self.runRequested)
        self.cancelButton.clicked.connect(self.cancelRequested)
        self.exportCsvButton.clicked.connect(self.exportCsvRequested)

        form = QFormLayout()
        for label, widget in rows:
            form.addRow(label, widget)
            if isinstance(widget, QLineEdit):  # the whole default list readable, from its start
                widget.setMinimumWidth(min(200, widget.fontMetrics().horizontalAdvance(widget.text()) + 24))
                widget.setCursorPosition(0)
        left = QWidget()
        column = QVBoxLayout(left)
        column.setContentsMargins(0, 0, 0, 0)
        column.addLayout(form)
        column.addLayout(_row(self.runButton, self.cancelButton))
        column.addWidget(self.progressBar)
        column.addWidget(status)
        column.addStretch(1)
        column.addLayout(_row(*extra_footer, self.exportCsvButton))
        splitter = QSplitter(Qt.Orientation.Horizontal)
        inputs = scrolled(
            left
        )  # the inputs scroll; the result view takes what the window gives or takes away
        inputs.setMinimumWidth(min(180, left.minimumSizeHint().width()))
        splitter.addWidget(inputs)
        splitter.addWidget(view)
        splitter.setCollapsible(0, False)
        splitter.setCollapsible(1, False)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        whole = left.minimumSizeHint().width() + inputs.verticalScrollBar().sizeHint().width()
        splitter.setSizes([whole, 3 * whole])  # the inputs whole while there is room
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(splitter)
        return status

    def checked_methods(self) -> list[str]:
        return self.methodsList.checked()

    def set_methods(self, names: list[str]) -> None:
        self.methodsList.set_checked(names)

    def _set_running(self, running: bool, total: int, status: QLabel, text: str) -> None:
        """Run enabled when idle, Cancel while running; a new run starts the bar at 0 of `total`."""
        self.runButton.setEnabled(not running)
        self.cancelButton.setEnabled(running)
        if running:
            self.progressBar.setRange(0, max(total, 1))
            self.progressBar.setValue(0)
            status.setText(text)


def _row(*widgets: QWidget) -> QHBoxLayout:
    row = QHBoxLayout()
    for w in widgets:
        row.addWidget(w)
    return row
