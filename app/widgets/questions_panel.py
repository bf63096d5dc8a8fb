"""The Questions dock's widget: questions about the prompt (the context), each with an optional expected answer;
the mode (query-agnostic: the context compressed once, then each question appended; query-aware: each question
compressed with the context); the dense and compressed answers side by side, ✓/✗ against the expected answer,
and the accuracy over the questions. It only collects and shows; app.controllers.questions runs the answers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.widgets.scrolling import scrolled
from kvcore.defaults import DEFAULT_ANSWER_TOKENS
from kvcore.engine.questions import Answer, Question

QUESTION, EXPECTED, DENSE, COMPRESSED = range(4)
HEADERS = ("Question", "Expected", "Dense answer", "Compressed answer")
AGNOSTIC, AWARE = "agnostic", "aware"
CORRECT_RGB, WRONG_RGB = (30, 130, 50), (200, 40, 55)
#: The answer tokens the spin box allows (an answer is a name or a value: short).
MAX_ANSWER_TOKENS = 256
#: The widest the question and expected-answer columns open (pixels); a longer text shows whole in its tooltip.
QUESTION_WIDTH, EXPECTED_WIDTH = 320, 120


def one_line(text: str) -> str:
    """An answer on one table line: each line break, with the indentation after it, shown as one ⏎ (the cell's
    tooltip has the text as generated)."""
    return re.sub(r"[ \t]*(\r?\n)+[ \t]*", "⏎ ", text).replace("\t", "⇥")


def mark(correct: bool | None) -> str:
    return "" if correct is None else ("✓ " if correct else "✗ ")


class QuestionsPanel(QWidget):
    """Emits runRequested, cancelRequested, loadRequested, markRequested(row), settingsChanged (mode or length)
    and questionsEdited (a question or its expected answer changed: its answers are no longer shown)."""

    runRequested = Signal()  # noqa: N815 (Qt signal naming)
    cancelRequested = Signal()  # noqa: N815
    loadRequested = Signal()  # noqa: N815
    markRequested = Signal(int)  # noqa: N815
    settingsChanged = Signal()  # noqa: N815
    questionsEdited = Signal()  # noqa: N815

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("questionsPanel")
        self.modeCombo = QComboBox(objectName="questionsModeCombo")
        self.modeCombo.addItem("Query-agnostic", AGNOSTIC)
        self.modeCombo.addItem("Query-aware", AWARE)
        self.modeCombo.setToolTip(
            "Query-agnostic: the context is compressed once, then each question is appended to the compressed "
            "cache (kvpress's evaluation).\nQuery-aware: each question is compressed with the context, so it "
            "sits in every observation window (one prefill a question)."
        )
        self.tokensSpin = QSpinBox(objectName="questionsTokensSpin")
        self.tokensSpin.setRange(1, MAX_ANSWER_TOKENS)
        self.tokensSpin.setValue(DEFAULT_ANSWER_TOKENS)
        self.tokensSpin.setToolTip("Tokens generated for each answer")
        self.addButton = QPushButton("Add", objectName="questionsAddButton")
        self.addButton.setToolTip("Add a question row (type the question, and its expected answer if known)")
        self.removeButton = QPushButton("Remove", objectName="questionsRemoveButton")
        self.removeButton.setToolTip("Remove the selected question")
        self.loadButton = QPushButton("Load JSONL…", objectName="questionsLoadButton")
        self.loadButton.setToolTip('Replace the questions with a file of {"question": …, "answer": …} lines')
        self.runButton = QPushButton("Answer", objectName="questionsRunButton")
        self.runButton.setToolTip(
            "Answer every question at the current setting; then every slider move answers them again"
        )
        self.cancelButton = QPushButton("Cancel", objectName="questionsCancelButton")
        self.cancelButton.setEnabled(False)
        self.markButton = QPushButton("Mark attention", objectName="questionsMarkButton")
        self.markButton.setToolTip(
            "Ring, in the heatmap, the context positions the selected question attends to most in each "
            "layer and kv-head (the dense model's attention)"
        )
        self.progressBar = QProgressBar(objectName="questionsProgressBar")
        self.progressBar.setRange(0, 1)
        self.progressBar.setValue(0)
        self.accuracyLabel = QLabel("", objectName="questionsAccuracyLabel")
        self.accuracyLabel.setWordWrap(True)
        self.statusLabel = QLabel("", objectName="questionsStatusLabel")
        self.statusLabel.setWordWrap(True)

        self.table = QTableWidget(0, len(HEADERS), objectName="questionsTable")
        self.table.setHorizontalHeaderLabels(list(HEADERS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setWordWrap(False)
        header = self.table.horizontalHeader()
        header.setMinimumSectionSize(60)
        for column in (
            QUESTION,
            EXPECTED,
        ):  # sized to their text (QUESTION_WIDTH at most), the answers share the rest
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Interactive)
        for column in (DENSE, COMPRESSED):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 8)

        form = QFormLayout()
        form.addRow("Mode", self.modeCombo)
        form.addRow("Answer tokens", self.tokensSpin)
        left = QWidget()
        column = QVBoxLayout(left)
        column.setContentsMargins(0, 0, 0, 0)
        column.addLayout(form)
        column.addLayout(_row(self.addButton, self.removeButton))
        column.addWidget(self.loadButton)
        column.addLayout(_row(self.runButton, self.cancelButton))
        column.addWidget(self.progressBar)
        column.addWidget(self.accuracyLabel)
        column.addWidget(self.markButton)
        column.addWidget(self.statusLabel)
        column.addStretch(1)
        inputs = scrolled(left)
        inputs.setMinimumWidth(min(190, left.minimumSizeHint().width()))
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(inputs)
        splitter.addWidget(self.table)
        splitter.setCollapsible(0, False)
        splitter.setCollapsible(1, False)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        whole = left.minimumSizeHint().width() + inputs.verticalScrollBar().sizeHint().width()
        splitter.setSizes([whole, 4 * whole])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(splitter)

        self.addButton.clicked.connect(lambda: self._add_and_edit())
        self.removeButton.clicked.connect(self.remove_selected)
        self.loadButton.clicked.connect(self.loadRequested)
        self.runButton.clicked.connect(self.runRequested)
        self.cancelButton.clicked.connect(self.cancelRequested)
        self.markButton.clicked.connect(lambda: self.markRequested.emit(self.selected_row()))
        self.modeCombo.currentIndexChanged.connect(self.settingsChanged)
        self.tokensSpin.valueChanged.connect(self.settingsChanged)
        self.table.itemChanged.connect(self._on_item_changed)

    # -- questions --------------------------------------------------------------------------------

    def add_question(self, text: str = "", answer: str | None = None) -> int:
        """Append a row; returns its index."""
        row = self.table.rowCount()
        self.table.blockSignals(True)
        self.table.insertRow(row)
        self.table.setItem(row, QUESTION, QTableWidgetItem(text))
        self.table.setItem(row, EXPECTED, QTableWidgetItem(answer or ""))
        for column in (DENSE, COMPRESSED):
            item = QTableWidgetItem("")
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
            self.table.setItem(row, column, item)
        self.table.item(row, QUESTION).setToolTip(text)
        self.table.blockSignals(False)
        self._fit_columns()
        self.questionsEdited.emit()
        return row

    def _fit_columns(self) -> None:
        """The question and expected columns wide enough for their longest text (within bounds), so a question
        is read whole where it fits and the answers keep at least half the table."""
        metrics, header = self.table.fontMetrics(), self.table.horizontalHeader()
        for column, most in ((QUESTION, QUESTION_WIDTH), (EXPECTED, EXPECTED_WIDTH)):
            texts = [HEADERS[column]] + [
                self.table.item(r, column).text() for r in range(self.table.rowCount())
            ]
            header.resizeSection(column, min(most, max(metrics.horizontalAdvance(t) for t in texts) + 16))

    def _add_and_edit(self) -> None:
        row = self.add_question()
        self.table.setCurrentCell(row, QUESTION)
        self.table.editItem(self.table.item(row, QUESTION))

    def set_questions(self, questions: Sequence[Question]) -> None:
        """Replace every row with `questions` (their answers not yet run)."""
        self.table.setRowCount(0)
        for q in questions:
            self.add_question(q.text, q.answer)
        self.clear_answers()

    def remove_selected(self) -> None:
        row = self.selected_row()
        if row >= 0:
            self.table.removeRow(row)
            self.questionsEdited.emit()

    def selected_row(self) -> int:
        """The selected question's row, -1 when none is selected."""
        rows = self.table.selectionModel().selectedRows()
        return rows[0].row() if rows else self.table.currentRow()

    def questions(self) -> list[Question]:
        """The typed questions, blank rows skipped; ValueError naming the row when one cannot be asked."""
        out = []
        for row in range(self.table.rowCount()):
            text, answer = (self.table.item(row, c).text().strip() for c in (QUESTION, EXPECTED))
            if not text and answer:
                raise ValueError(f"row {row + 1} has an expected answer but no question: type the question")
            if text:
                out.append(Question(text, answer or None))
        if not out:
            raise ValueError("there are no questions: type one (Add) or load a JSONL file")
        return out

    def query_aware(self) -> bool:
        return self.modeCombo.currentData() == AWARE

    def set_query_aware(self, aware: bool) -> None:
        self.modeCombo.setCurrentIndex(self.modeCombo.findData(AWARE if aware else AGNOSTIC))

    def answer_tokens(self) -> int:
        return self.tokensSpin.value()

    # -- answers ----------------------------------------------------------------------------------

    def set_answers(self, answers: Sequence[Answer]) -> None:
        """Fill the answer columns row by row (the rows asked, in order: blank rows were skipped)."""
        asked = [r for r in range(self.table.rowCount()) if self.table.item(r, QUESTION).text().strip()]
        self.table.blockSignals(True)
        for row, answer in zip(asked, answers, strict=False):
            kl, agreement = answer.metrics.get("kl_mean"), answer.metrics.get("agreement")
            detail = f"KL {kl:.4g}, top-1 agreement {agreement:.2f} (teacher-forced on the dense answer)"
            for column, text, correct in (
                (DENSE, answer.dense_text, answer.dense_correct),
                (COMPRESSED, answer.compressed_text, answer.compressed_correct),
            ):
                item = self.table.item(row, column)
                item.setText(mark(correct) + one_line(text))
                item.setToolTip(text + ("\n\n" + detail if column == COMPRESSED else ""))
                colour = None if correct is None else (CORRECT_RGB if correct else WRONG_RGB)
                item.setForeground(QBrush(QColor(*colour)) if colour else QBrush())
        self.table.blockSignals(False)

    def answer_texts(self, row: int) -> tuple[str, str]:
        """(dense, compressed) cells of `row` as shown."""
        return self.table.item(row, DENSE).text(), self.table.item(row, COMPRESSED).text()

    def clear_answers(self, row: int | None = None) -> None:
        """Empty the answer columns (of one row, or of all) and, for all, the accuracy."""
        rows = range(self.table.rowCount()) if row is None else [row]
        self.table.blockSignals(True)
        for r in rows:
            for column in (DENSE, COMPRESSED):
                item = self.table.item(r, column)
                item.setText("")
                item.setToolTip("")
        self.table.blockSignals(False)
        if row is None:
            self.accuracyLabel.setText("")

    def set_accuracy(self, dense: float | None, compressed: float | None, label: str) -> None:
        """The accuracy over the questions with an expected answer, and the setting (`label`) it was measured at."""
        if compressed is None:
            self.accuracyLabel.setText(
                f"No expected answers, so no accuracy: compare the columns.<br>{label}"
            )
            return
        self.accuracyLabel.setText(
            f"<b>Accuracy: compressed {compressed:.0%} · dense {dense:.0%}</b><br>{label}"
        )

    def set_running(self, running: bool, total: int = 0) -> None:
        self.cancelButton.setEnabled(running)
        if running:
            self.progressBar.setRange(0, max(total, 1))
            self.progressBar.setValue(0)
        else:
            self.progressBar.setValue(self.progressBar.maximum())

    def set_status(self, text: str) -> None:
        self.statusLabel.setText(text)

    def _on_item_changed(self, item: QTableWidgetItem) -> None:
        if item.column() in (QUESTION, EXPECTED):
            if item.column() == QUESTION:
                item.setToolTip(item.text())
            self._fit_columns()
            self.clear_answers(item.row())
            self.questionsEdited.emit()


def _row(*widgets: QWidget) -> QHBoxLayout:
    row = QHBoxLayout()
    for w in widgets:
        row.addWidget(w)
    return row
