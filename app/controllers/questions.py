"""The Questions dock's behaviour: answer the typed or loaded questions about the prefilled prompt on the engine
thread at the Compression panel's setting — again on every setting change once answered (coalesced as a recompress:
a drag ends on its last setting) — show dense and compressed answers, marks and accuracy, cancel, and ring in the
heatmap the context positions a chosen question attends to.

Bad input (no model, no prefill, no questions, a question file that is not one) gets a dialog naming the fix; the
questions typed and the answers shown stay as they were.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget

from app.controllers.file_dialogs import open_path
from app.controllers.host import Host, baseline_dtype, show_run_dock
from app.engine import question_jobs
from app.engine.question_jobs import QUESTION_ATTENTION, QUESTIONS, AttentionView, QuestionsView
from app.engine.thread import JobFailure, JobResult
from app.widgets.config_text import config_label
from app.widgets.questions_panel import QuestionsPanel
from kvcore.defaults import QUESTION_ATTENTION_TOP
from kvcore.engine.questions import Question
from kvcore.sets.prompt_sets import PromptSetError
from kvcore.sets.questions_file import load_questions

QUESTIONS_SHORTCUT = "Ctrl+Shift+K"
#: The file dialog kind (its own last folder).
QUESTION_FILES = "questions"
FILTER = "Question files (*.jsonl);;All files (*)"


class QuestionsController:
    """Owns the answers in flight and whether the panel follows the setting (`live`: answered once)."""

    def __init__(self, host: Host, panel: QuestionsPanel, dock: QDockWidget) -> None:
        self.host = host
        self.panel, self.dock = panel, dock
        self.request_id: int | None = None
        self.live = False  # answered once: every setting change answers again
        self.last: QuestionsView | None = None
        self.attention: AttentionView | None = None
        panel.runRequested.connect(self.run)
        panel.cancelRequested.connect(self.cancel)
        panel.loadRequested.connect(self.load_dialog)
        panel.markRequested.connect(self.mark_attention)
        panel.settingsChanged.connect(self.follow)
        panel.questionsEdited.connect(self._on_edited)
        host.controls.configChanged.connect(self.follow)
        host.engine.progressed.connect(self._on_progress)
        self.show_action = QAction("&Questions", host.widget)
        self.show_action.setShortcut(QKeySequence(QUESTIONS_SHORTCUT))
        self.show_action.setStatusTip(
            "Show the Questions dock: questions answered from the compressed context"
        )
        self.show_action.triggered.connect(lambda _=False: self.show_dock())
        host.widget.addAction(self.show_action)

    @property
    def running(self) -> bool:
        return self.request_id is not None

    def for_sweep(self) -> tuple[list[Question], int]:
        """(questions, answer tokens) a sweep measures accuracy over: [] when the panel has none to ask."""
        try:
            return self.panel.questions(), self.panel.answer_tokens()
        except ValueError:
            return [], self.panel.answer_tokens()

    def show_dock(self) -> None:
        show_run_dock(self.host.widget, self.dock)

    # -- answering ------------------------------------------------------------------------------------

    def run(self) -> int | None:
        """Answer every question at the current setting; a dialog naming the problem when it cannot run."""
        w = self.host
        if w.model_info is None:
            w.error("No model loaded", "Load a model, then prefill the context the questions are about.")
            return None
        if not w.prefilled:
            w.error(
                "No context",
                "Prefill a prompt first: it is the context the questions are asked about.",
            )
            return None
        try:
            questions = self.panel.questions()
            config = w.controls.config()
        except ValueError as exc:
            w.error("Cannot answer the questions", str(exc))
            return None
        self.live = True
        return self._submit(questions, config)

    def follow(self, *_: object) -> int | None:
        """A setting changed: answer again when the panel is live and can ask (silently stays otherwise)."""
        if not self.live or not self.host.prefilled:
            return None
        try:
            questions = self.panel.questions()
        except ValueError as exc:
            self.panel.set_status(f"Not answered again: {exc}.")
            return None
        return self._submit(questions, self.host.controls.config())

    def _submit(self, questions: list[Question], config: dict) -> int:
        engine = self.host.engine
        aware = self.panel.query_aware()
        job = question_jobs.answer_questions(
            config,
            questions,
            aware,
            self.panel.answer_tokens(),
            is_current=lambda rid: engine.is_current(rid, QUESTIONS),
        )
        self.panel.set_running(True, len(questions))
        self.panel.set_status(f"Answering {len(questions)} question{'s' if len(questions) != 1 else ''}…")
        self.request_id = engine.submit(
            QUESTIONS, job, coalesce=True, on_result=self.on_finished, on_failure=self.on_failed
        )
        return self.request_id

    def _on_progress(self, request_id: int, text: str, fraction: float) -> None:
        if request_id == self.request_id:
            bar = self.panel.progressBar
            bar.setValue(round(fraction * bar.maximum()))
            self.panel.set_status(text + "…")

    def cancel(self) -> None:
        """Stop answering (the panel's Cancel, and Session ▸ Cancel / Esc through the window); the answers shown
        stay, of the last finished setting. A request dropped before it started calls nothing back, so the panel
        stops waiting here, not in on_failed."""
        self.host.engine.cancel(QUESTIONS)
        self.host.engine.cancel(QUESTION_ATTENTION)
        if self.running:
            self.request_id = None
            self.panel.set_running(False)
            self.panel.set_status("Cancelled: the answers shown are of the last finished setting.")
            self.host.status.show("Answering cancelled.")

    def on_finished(self, result: JobResult) -> None:
        view: QuestionsView | None = result.value
        if result.request_id != self.request_id:
            return
        self.request_id = None
        self.panel.set_running(False)
        if view is None:  # nothing prefilled, or a newer setting superseded it
            return
        self.last = view
        label = config_label(view.config, baseline_dtype(self.host))
        mode = "query-aware" if view.query_aware else "query-agnostic"
        self.panel.set_answers(view.answers)
        self.panel.set_accuracy(view.accuracy_dense, view.accuracy_compressed, f"{mode}, {label}")
        self.panel.set_status(
            f"{len(view.answers)} answered in {result.seconds:.1f} s ({mode}); they follow the Compression "
            "panel."
        )

    def on_failed(self, failure: JobFailure) -> None:
        if failure.request_id != self.request_id:
            return
        self.request_id = None
        self.panel.set_running(False)
        if failure.cancelled:
            self.panel.set_status("Cancelled: the answers shown are of the last finished setting.")
            self.host.status.show("Answering cancelled.")
            return
        self.live = False
        self.panel.set_status(f"Stopped: {failure.message}")
        self.host.error("Could not answer the questions", failure.message)

    def on_prefilled(self) -> None:
        """A new context: its answers and attention marks are gone; a live panel answers again."""
        self.attention = None
        self.host.heatmap.set_marks(None)
        self.panel.clear_answers()
        self.follow()

    def _on_edited(self) -> None:
        if self.attention is not None:
            self.attention = None
            self.host.heatmap.set_marks(None)

    # -- loading ------------------------------------------------------------------------------------

    def load(self, path: str | Path) -> bool:
        """Replace the questions with a JSONL file's; a dialog naming the file and line when it is not one."""
        try:
            questions = load_questions(Path(path))
        except (PromptSetError, OSError) as exc:
            self.host.error("Cannot load the questions", str(exc))
            return False
        self.panel.set_questions(questions)
        self.panel.set_status(f"Loaded {len(questions)} questions from {Path(path).name}.")
        self.follow()
        return True

    def load_dialog(self) -> None:
        path = open_path(self.host.widget, self.host.settings, QUESTION_FILES, "Load questions", FILTER)
        if path:
            self.load(path)

    # -- attention ----------------------------------------------------------------------------------

    def mark_attention(self, row: int) -> int | None:
        """Ring, in the heatmap, each (layer, kv-head)'s most attended context positions for question `row`."""
        w = self.host
        if not w.prefilled:
            w.error("No context", "Prefill a prompt first: the question attends over it.")
            return None
        text = self._question_text(row)
        if not text:
            w.error(
                "No question chosen", "Select a question in the table (click its row), then Mark attention."
            )
            return None
        return w.engine.submit(
            QUESTION_ATTENTION,
            question_jobs.attention_of(text, QUESTION_ATTENTION_TOP),
            on_result=self._on_attention,
            on_failure=self._on_attention_failed,
        )

    def _question_text(self, row: int) -> str:
        table = self.panel.table
        if not 0 <= row < table.rowCount():
            return ""
        return table.item(row, 0).text().strip()

    def _on_attention(self, result: JobResult) -> None:
        view: AttentionView = result.value
        try:
            self.host.heatmap.set_marks(view.marked, f"most attended by {view.question!r}")
        except ValueError:
            self.host.status.warn(
                "The heatmap shows no compression of this prefill yet: mark again after it."
            )
            return
        self.attention = view
        self.panel.set_status(
            f"Rings in the heatmap: the {QUESTION_ATTENTION_TOP} context positions each layer and kv-head attends "
            f"to most from {_short(view.question)} (the dense model's attention; hover a cell for its token)."
        )

    def _on_attention_failed(self, failure: JobFailure) -> None:
        if failure.cancelled:
            self.panel.set_status("Attention marking cancelled.")
        else:
            self.host.error("Could not mark the attention", failure.message)


def _short(text: str, most: int = 40) -> str:
    """A question quoted on one line, cut to `most` characters."""
    line = text.replace("\n", "⏎")
    return repr(line if len(line) <= most else line[: most - 1] + "…")
