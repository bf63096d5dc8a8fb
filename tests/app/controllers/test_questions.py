"""The Questions dock in the real window on the demo model (the llama test model without it): two questions typed
with expected answers are answered from the compressed context exactly as a Session in the test thread answers
them (Session.answer), with ✓/✗ and the accuracy; a ratio slider move answers them again at the new setting; the
heatmap rings a question's most attended positions; bad input gets one clear message and loses nothing."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QLineEdit

from app.engine.question_jobs import QUESTIONS
from app.widgets.questions_panel import EXPECTED, QUESTION, mark, one_line
from kvcore.engine.question_attention import question_attention, top_positions
from kvcore.engine.questions import Question, answer_query_aware
from kvcore.engine.session import CompressionConfig, Session
from tests.app.waiting import wait_until
from tests.app.windows import window_and_reference

TOKENS = 2
ANSWER_TOKENS = 3
PROMPT = "def area(width, height):\n    return width * height\n\n"
QUESTIONS_TEXT = ("print(area(", "def perimeter(width, height): return")


@pytest.fixture(scope="module")
def ctx(qapp, model_dirs, tmp_path_factory):
    window, ref = window_and_reference(
        model_dirs, tmp_path_factory.mktemp("settings") / "s.json", TOKENS, PROMPT
    )
    window.questionsPanel.tokensSpin.setValue(ANSWER_TOKENS)
    yield window, ref
    window.close()
    QApplication.processEvents()


def _type(panel, row: int, column: int, text: str) -> None:
    """Type `text` into a cell through its editor, as a user does, and commit it with Return."""
    QApplication.processEvents()  # the last cell's editor closes
    panel.table.setCurrentCell(row, column)
    panel.table.editItem(panel.table.item(row, column))
    editors = [e for e in panel.table.findChildren(QLineEdit) if e.isVisible()]
    assert len(editors) == 1, "the cell opened one editor"
    editors[0].selectAll()
    QTest.keyClicks(editors[0], text)
    QTest.keyClick(editors[0], Qt.Key.Key_Return)
    QApplication.processEvents()


def _answered(window) -> None:
    rid = window.engine.latest_id(QUESTIONS)
    wait_until(lambda: window.questioning.last is not None and window.questioning.last.request_id == rid)


def _expected(ref, ratio: float):
    state = ref.compress(CompressionConfig.from_dict({**CONFIG, "ratio": ratio}))
    return [ref.answer(state, Question(q), ANSWER_TOKENS) for q in QUESTIONS_TEXT]


CONFIG = {"method": "snapkv", "ratio": 0.5, "bits": 16}


def test_two_typed_questions_answered_with_marks_then_again_on_a_slider_move(ctx):
    window, ref = ctx
    window.controls.set_config(CONFIG)
    window.request_compression()
    panel = window.questionsPanel
    QTest.keyClick(
        window, Qt.Key.Key_K, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    )
    assert window.questionsDock.isVisible()
    expected = _expected(ref, 0.5)
    # The first question's expected answer is what the dense cache says (✓ there), the second's nothing it says.
    right = expected[0].dense_text.strip()[:2] or expected[0].dense_text
    for i, (question, answer) in enumerate(zip(QUESTIONS_TEXT, (right, "§never§"), strict=True)):
        QTest.mouseClick(panel.addButton, Qt.MouseButton.LeftButton)
        _type(panel, i, QUESTION, question)
        _type(panel, i, EXPECTED, answer)
    assert [q.text for q in panel.questions()] == list(QUESTIONS_TEXT)
    QTest.mouseClick(panel.runButton, Qt.MouseButton.LeftButton)
    _answered(window)
    for row, want in enumerate(expected):
        assert panel.answer_texts(row) == (
            mark(row == 0) + one_line(want.dense_text),
            mark(right in want.compressed_text if row == 0 else False) + one_line(want.compressed_text),
        )
    assert panel.answer_texts(0)[0].startswith("✓") and panel.answer_texts(1)[0].startswith("✗")
    assert "dense 50%" in panel.accuracyLabel.text()

    first = window.questioning.last.request_id
    window.controls.retentionSlider.setValue(20)  # a slider move: the answers follow it
    _answered(window)
    assert window.questioning.last.request_id > first
    assert window.questioning.last.config["ratio"] == pytest.approx(0.2)
    for row, want in enumerate(_expected(ref, 0.2)):
        assert panel.answer_texts(row)[1].endswith(one_line(want.compressed_text))


def test_query_aware_answers_are_context_and_question_compressed_together(ctx):
    window, ref = ctx
    panel = window.questionsPanel
    panel.set_questions([Question(QUESTIONS_TEXT[0])])
    panel.set_query_aware(True)  # a live panel answers again at once
    try:
        _answered(window)
        view = window.questioning.last
        assert view.query_aware
        fresh = Session(ref.model, ref.tokenizer, ref.info)
        cfg = CompressionConfig.from_dict(window.controls.config())
        want = answer_query_aware(fresh, ref.prompt_ids, Question(QUESTIONS_TEXT[0]), cfg, ANSWER_TOKENS)
        assert panel.answer_texts(0) == (one_line(want.dense_text), one_line(want.compressed_text))
        assert "query-aware" in panel.accuracyLabel.text()
    finally:
        panel.set_questions([Question(q) for q in QUESTIONS_TEXT])
        panel.set_query_aware(False)
        _answered(window)


def test_esc_stops_answering_and_keeps_the_answers_shown(ctx):
    window, _ = ctx
    panel = window.questionsPanel
    shown = [panel.answer_texts(r) for r in range(2)]  # the query-agnostic answers the last test ended on
    assert all(shown)
    panel.tokensSpin.setValue(200)  # a live panel answers again, at length
    assert window.questioning.running and panel.cancelButton.isEnabled()
    cancel = window.actions_.cancel
    assert cancel.shortcut().toString() == "Esc"
    cancel.trigger()  # Session ▸ Cancel (Esc)
    wait_until(lambda: not window.questioning.running, timeout=10)
    assert "Cancelled" in panel.statusLabel.text() and not panel.cancelButton.isEnabled()
    assert [panel.answer_texts(r) for r in range(2)] == shown
    panel.tokensSpin.setValue(ANSWER_TOKENS)
    _answered(window)


def test_a_sweep_measures_accuracy_over_the_questions(ctx):
    window, _ = ctx
    window.questionsPanel.set_questions([Question(QUESTIONS_TEXT[0], "("), Question(QUESTIONS_TEXT[1], "§")])
    panel = window.sweepPanel
    panel.set_methods(["snapkv"])
    panel.ratiosEdit.setText("0.25,1")
    panel.bitsEdit.setText("16")
    QTest.mouseClick(panel.runButton, Qt.MouseButton.LeftButton)
    wait_until(lambda: not window.sweeping.running)
    points = window.sweeping.points()
    assert len(points) == 2 and all(p.metrics["question_accuracy"] is not None for p in points)
    assert panel.frontier.metric_key() == "question_accuracy"


def test_mark_attention_rings_each_rows_top_positions(ctx):
    window, ref = ctx
    panel = window.questionsPanel
    if panel.table.rowCount() == 0:
        panel.add_question(QUESTIONS_TEXT[1])
    panel.table.selectRow(panel.table.rowCount() - 1)
    text = panel.table.item(panel.table.rowCount() - 1, QUESTION).text()
    QTest.mouseClick(panel.markButton, Qt.MouseButton.LeftButton)
    wait_until(lambda: window.heatmap.marks() is not None)
    ids = ref.tokenizer.encode(text, add_special_tokens=False)
    want = top_positions(question_attention(ref.model, ref.prompt_ids, ids))
    marks = window.heatmap.marks()
    np.testing.assert_array_equal(marks, want.reshape(marks.shape))
    assert len(window.heatmap.marked_cells()) == int(marks.sum())
    row, position = window.heatmap.marked_cells()[0]
    assert "most attended by" in window.heatmap.info_at(row, position)


def test_bad_input_names_the_problem_and_keeps_the_questions(ctx, tmp_path):
    window, _ = ctx
    panel, control = window.questionsPanel, window.questioning
    control.run()
    _answered(window)
    before = [panel.table.item(r, QUESTION).text() for r in range(panel.table.rowCount())]
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question": "a?", "answer": "b"}\n{"question": "c?", "answer": \n', encoding="utf-8")
    assert not control.load(bad)
    assert f"{bad}:2" in window.last_error
    assert [panel.table.item(r, QUESTION).text() for r in range(panel.table.rowCount())] == before
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    assert not control.load(empty)
    assert "no questions" in window.last_error

    saved = [(panel.table.item(r, QUESTION).text(), panel.table.item(r, EXPECTED).text()) for r in range(2)]
    answers = [panel.answer_texts(r) for r in range(2)]
    panel.table.setRowCount(0)
    assert control.run() is None
    assert "no questions" in window.last_error
    panel.set_questions([Question(q, a or None) for q, a in saved])
    panel.set_answers(window.questioning.last.answers)
    assert [panel.answer_texts(r) for r in range(2)] == answers

    window.prefilled = False  # as before any prefill
    try:
        assert control.run() is None
        assert "Prefill a prompt first" in window.last_error
    finally:
        window.prefilled = True
    assert [panel.answer_texts(r) for r in range(2)] == answers
