"""The Sweep dock's behaviour: run a grid on the engine thread over the current prefill, stream its points into
the frontier plot, cancel (finished points stay), apply a clicked point, export PNG/SVG and CSV.

A sweep is measured against the dense continuation on screen, so a new prefill, a longer continuation or
another model clears it, and the status bar says so. Applying a point sets the compression controls to its
configuration; the usual coalesced recompress then redraws the heatmap, continuations and statistics from the
same prefill. The plot may instead show a prompt-set results file (app.controllers.results_files): those points belong to
no session, so a new prefill keeps them and clicking one only says its configuration in the status bar.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget

from app.controllers.file_dialogs import SWEEPS, save_path
from app.controllers.host import Host, baseline_dtype, show_run_dock
from app.controllers.plot_exports import ask_image_path, export_plot, export_rows
from app.engine import jobs
from app.engine.thread import JobFailure, JobResult
from app.widgets.config_text import config_label
from app.widgets.frontier import result_text
from app.widgets.sweep_panel import SweepPanel
from kvcore.engine.questions import Question
from kvcore.engine.session import CompressionConfig
from kvcore.engine.sweep import SweepPoint, check_group_size, grid, remaining_seconds
from kvcore.measure.export import SWEEP_COLUMNS
from kvcore.sets.results_file import ResultPoint

SWEEP_SHORTCUT = "Ctrl+Shift+F"


class SweepController:
    """Owns the sweep in flight (its request id and size) and the points the frontier plot shows."""

    def __init__(self, host: Host, panel: SweepPanel, dock: QDockWidget) -> None:
        self.host = host
        self.panel, self.dock = panel, dock
        self.plot = self.panel.frontier
        self.request_id: int | None = None
        self.total = 0
        self.results_path: Path | None = None  # the results file the plot shows, when it shows one
        #: Where the questions come from (the Questions dock): every point then measures their accuracy.
        self.questions: Callable[[], tuple[list[Question], int]] = lambda: ([], 0)
        self.panel.runRequested.connect(self.run)
        self.panel.cancelRequested.connect(self.cancel)
        self.panel.exportCsvRequested.connect(self.export_csv_dialog)
        self.plot.exportImageButton.clicked.connect(self.export_image_dialog)
        self.plot.pointClicked.connect(self.apply_point)
        self.plot.hoverInfo.connect(host.status.show_hover)
        self.show_action = QAction("S&weep && Frontier", host.widget)
        self.show_action.setShortcut(QKeySequence(SWEEP_SHORTCUT))
        self.show_action.setStatusTip(
            "Show the Sweep dock: many configurations over one prefill, on a frontier"
        )
        self.show_action.triggered.connect(lambda _=False: self.show_dock())
        host.widget.addAction(self.show_action)

    @property
    def running(self) -> bool:
        return self.request_id is not None

    def points(self) -> list[SweepPoint | ResultPoint]:
        return self.plot.points()

    def show_results(self, points: list[ResultPoint], path: str | Path) -> None:
        """Show a results file's configurations in the frontier plot (a sweep shown there is replaced)."""
        self.results_path = Path(path)
        self.plot.set_points(points)
        prompts = max(p.prompts for p in points)
        self.panel.set_status(
            f"{self.results_path.name}: {len(points)} configurations over {prompts} prompt"
            f"{'s' if prompts != 1 else ''}; {len(self.plot.frontier())} on the frontier of the means. "
            + (
                "Hover a point for its interval."
                if any(p.intervals for p in points)
                else "One prompt: no intervals."
            )
        )
        self.show_dock()

    def show_dock(self) -> None:
        show_run_dock(self.host.widget, self.dock)
        self.panel.methodsList.setFocus()

    # -- run / cancel ---------------------------------------------------------------------------------

    def run(self) -> int | None:
        """Start a sweep of the dock's grid over the current prefill; a message instead when it cannot run."""
        w = self.host
        if self.running:
            w.status.show("A sweep is running: Cancel it first.")
            return None
        if not w.prefilled:
            w.error("Nothing to sweep", "Prefill a prompt first: a sweep compresses its cache many ways.")
            return None
        try:
            spec = self.panel.spec()
            base = CompressionConfig.from_dict(w.controls.config())
            configs = grid(spec.methods, spec.ratios, spec.bits, spec.group_size, base=base)
            if w.model_info is not None:
                check_group_size(configs, w.model_info.head_dim, w.model_info.value_dim)
        except ValueError as exc:
            w.error("Cannot run the sweep", str(exc))
            return None
        self.plot.clear()
        self.plot.set_baseline(baseline_dtype(w))
        self.results_path = None
        self.total = len(configs)
        self.panel.set_running(True, self.total)
        questions, answer_tokens = self.questions()
        if questions:
            w.status.show(
                f"Each point also answers the {len(questions)} questions of the Questions dock "
                "(query-agnostic): the frontier offers their accuracy."
            )
        self.request_id = w.engine.submit(
            jobs.SWEEP,
            jobs.sweep([c.to_dict() for c in configs], questions, answer_tokens),
            on_result=self.on_finished,
            on_failure=self.on_failed,
            on_partial=self._on_partial,
        )
        self.show_dock()
        return self.request_id

    def cancel(self) -> None:
        """Stop the sweep; the points already drawn stay. Thread-safe (only sets the job's cancel event)."""
        self.host.engine.cancel(jobs.SWEEP)

    def _on_partial(self, result: JobResult) -> None:
        if result.request_id != self.request_id:
            return
        self.plot.add_point(result.value)
        points = self.points()
        if len(points) == 1 and result.value.metrics.get("question_accuracy") is not None:
            self.plot.set_metric("question_accuracy")
        self.panel.show_progress(len(points), self.total, remaining_seconds(points, self.total))

    def on_finished(self, result: JobResult) -> None:
        if result.request_id != self.request_id:
            return
        self.request_id = None
        self.panel.set_running(False)
        n = len(self.points())
        self.panel.show_progress(n, self.total, None)
        self.panel.set_status(
            f"{n} points in {result.seconds:.1f} s; {len(self.plot.frontier())} on the frontier. Click a point to apply it."
        )

    def on_failed(self, failure: JobFailure) -> None:
        if failure.request_id != self.request_id:
            return
        self.request_id = None
        self.panel.set_running(False)
        n = len(self.points())
        if failure.cancelled:
            self.panel.set_status(f"Cancelled after {n} of {self.total} points; they stay.")
            self.host.status.show(f"Sweep cancelled after {n} of {self.total} points.")
        else:
            self.panel.set_status(f"Stopped after {n} of {self.total} points: {failure.message}")
            self.host.error("Sweep failed", failure.message)

    def clear(self, reason: str) -> str:
        """Forget the sweep (cancelling one in flight); returns what to tell the user ("" if there was none).
        A results file's points stay: they were measured on no prefill of this window."""
        if self.plot.showing_results():
            return ""
        had = bool(self.points()) or self.running
        if self.running:
            self.cancel()
            self.request_id = None
            self.panel.set_running(False)
        self.plot.clear()
        self.panel.set_status("")
        return f"The sweep was cleared: {reason}." if had else ""

    # -- apply a point --------------------------------------------------------------------------------

    def apply_point(self, index: int) -> None:
        """Set the controls to point `index`'s configuration; the recompress redraws everything (no prefill)."""
        point = self.points()[index]
        w = self.host
        if isinstance(point, ResultPoint):
            w.status.show(
                f"{result_text(point)} (from {self.results_path.name}: a results file has no session here, "
                "so nothing was applied; set it in the Compression panel to see it on your prompt)"
            )
            return
        w.controls.set_config(point.config.to_dict())
        if not w.controls.auto_regenerate():
            w.request_compression(regenerate=True)
        w.status.show(f"Applied {config_label(point.config.to_dict(), self.plot.baseline)} from the sweep.")

    # -- exports --------------------------------------------------------------------------------------

    def csv_rows(self) -> list[dict]:
        return [row for p in self.points() for row in p.csv_rows()]

    def export_csv(self, path: str | Path) -> bool:
        """Write the sweep with `kvlens sweep`'s columns; a message instead of an exception on failure."""
        w = self.host
        if self.plot.showing_results():
            w.error(
                "Nothing to export",
                f"The plot shows {self.results_path}: that file already holds these results. Run a sweep to "
                "export a new one.",
            )
            return False
        rows = self.csv_rows()
        if not export_rows(w, path, rows, SWEEP_COLUMNS, "Run a sweep first: it has no points yet."):
            return False
        w.status.show(f"Exported {len(self.points())} sweep points ({len(rows)} rows) to {path}")
        return True

    def export_image(self, path: str | Path, width: int | None = None) -> bool:
        if not self.plot.has_data():
            self.host.error("Nothing to export", "Run a sweep first: the frontier plot is empty.")
            return False
        return export_plot(self.host, self.plot, path, "frontier plot", empty=False, width=width)

    def export_csv_dialog(self) -> None:
        path, _ = save_path(
            self.host.widget, self.host.settings, SWEEPS, "Export sweep", "kvlens_sweep.csv", "CSV (*.csv)"
        )
        if path:
            self.export_csv(path)

    def export_image_dialog(self) -> None:
        chosen = ask_image_path(self.host.widget, "frontier plot", "kvlens_frontier", self.host.settings)
        if chosen:
            self.export_image(*chosen)
