"""A pyramidkv fallback is shown in the window: a note under the controls, a warning, the stats column."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.window.main_window import MainWindow
from tests.app.waiting import wait_until
from tests.app.windows import shown_after

PROMPT = "def main(argv): return sum(x * x for x in argv) The quick brown fox jumps over the lazy dog."


def test_pyramidkv_fallback_is_shown_and_cleared(qapp, model_dirs, tmp_path):
    window = MainWindow(
        model=str(model_dirs["llama"]), settings_path=tmp_path / "s.json", continuation_tokens=2
    )
    window.show()
    try:
        wait_until(lambda: window.model_info is not None)
        window.prefill(PROMPT)
        wait_until(lambda: window.displayed_ids)
        assert window.controls.budgetNoteLabel.isHidden()
        combo = window.controls.methodCombo
        shown_after(window, lambda: combo.setCurrentText("pyramidkv"))  # T < window 64: uniform
        note = window.controls.budgetNoteLabel.text()
        assert not window.controls.budgetNoteLabel.isHidden() and "uniform" in note
        assert window.status.last_warning and window.status.last_warning in note
        assert {r["budget_note"] for r in window.statsTable.rows()} == {window.status.last_warning}
        combo.setCurrentText("snapkv")  # cleared at once, before the new result arrives
        assert window.controls.budgetNoteLabel.isHidden() and window.status.last_warning is None
        assert (
            window.statusBar().currentMessage() == "" or "uniform" not in window.statusBar().currentMessage()
        )
        shown_after(window, lambda: None)
        assert window.controls.budgetNoteLabel.isHidden()
        assert {r["budget_note"] for r in window.statsTable.rows()} == {""}
    finally:
        window.close()
        QApplication.processEvents()
