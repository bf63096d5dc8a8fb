"""The Timeline dock's behaviour: decode under a policy on the engine thread (progress, cancel keeps what was
generated), draw the run's timeline, put the cache at the scrubbed step into the main heatmap, export PNG/SVG
and CSV.

The main heatmap shows the step the slider picks (every layer × kv-head, the positions written by then) while the
user scrubs; the next recompress from the Compression panel draws the prefill compression there again. A new
prefill or model clears the timeline: it was decoded from the old one.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget

from app.controllers.file_dialogs import STATS, save_path
from app.controllers.host import Host, show_run_dock
from app.controllers.plot_exports import ask_image_path, export_plot
from app.controllers.session_files import OPEN
from app.engine.thread import JobFailure, JobResult
from app.engine.timeline_jobs import DECODE, TimelineView, decode_timeline, policy_text
from app.widgets.timeline import TimelinePanel, summary_text
from kvcore.engine.decoding import DecodingPolicy
from kvcore.engine.timeline import write_timeline_csv

TIMELINE_SHORTCUT = "Ctrl+Shift+T"


class TimelineController:
    """Owns the decode in flight (its request id) and wires the panel's step to the main heatmap."""

    def __init__(self, host: Host, panel: TimelinePanel, dock: QDockWidget) -> None:
        self.host, self.panel, self.dock = host, panel, dock
        self.request_id: int | None = None
        panel.runRequested.connect(self.run)
        panel.cancelRequested.connect(self.cancel)
        panel.stepChanged.connect(self.show_step)
        panel.hoverInfo.connect(host.status.show_hover)
        panel.exportImageButton.clicked.connect(self.export_image_dialog)
        panel.exportCsvButton.clicked.connect(self.export_csv_dialog)
        host.engine.progressed.connect(self._on_progress)
        host.engine.resultReady.connect(self._on_engine_result)
        self.show_action = QAction("Decoding &Timeline", host.widget)
        self.show_action.setShortcut(QKeySequence(TIMELINE_SHORTCUT))
        self.show_action.setStatusTip(
            "Show the Timeline dock: evict while generating, and when each position left"
        )
        self.show_action.triggered.connect(lambda _=False: self.show_dock())
        host.widget.addAction(self.show_action)

    @property
    def running(self) -> bool:
        return self.request_id is not None

    def show_dock(self) -> None:
        show_run_dock(self.host.widget, self.dock)

    # -- run / cancel ---------------------------------------------------------------------------------

    def run(self) -> int | None:
        """Decode the panel's tokens under its policy from the current prefill; a message when it cannot."""
        w, p = self.host, self.panel
        if self.running:
            w.status.show("A decode is running: Cancel it (Esc) first.")
            return None
        if not w.prefilled:
            w.error("Nothing to decode", "Prefill a prompt first: the policy decodes from its cache.")
            return None
        policy = p.policy()
        try:
            DecodingPolicy(**policy)
        except ValueError as exc:
            w.error("Cannot decode", str(exc))
            return None
        config = w.controls.config()
        prefill = config if p.from_prefill_compression() else None
        p.set_running(True)
        p.set_summary(f"Decoding {p.tokens():,} tokens…")
        self.request_id = w.engine.submit(
            DECODE,
            decode_timeline(
                policy, p.tokens(), prefill, config["schedule"], beyond_context=p.beyond_context()
            ),
            on_result=self.on_finished,
            on_failure=self.on_failed,
        )
        self.show_dock()
        return self.request_id

    def cancel(self) -> None:
        """Stop the decode; what it generated so far is drawn. Thread-safe (sets the job's cancel event)."""
        self.host.engine.cancel(DECODE)

    def _on_progress(self, request_id: int, text: str, fraction: float) -> None:
        if request_id == self.request_id:
            self.panel.show_progress(fraction, text)

    def on_finished(self, result: JobResult) -> None:
        if result.request_id != self.request_id:
            return
        self.request_id = None
        self.panel.set_running(False)
        view: TimelineView = result.value
        self.panel.set_view(view)
        self.panel.set_summary(summary_text(view))
        self.host.status.show(
            ("Decode cancelled; the tokens generated so far are drawn. " if view.cancelled else "")
            + "Timeline drawn: scrub its steps to see the cache at each one in the heatmap."
        )

    def on_failed(self, failure: JobFailure) -> None:
        if failure.request_id != self.request_id:
            return
        self.request_id = None
        self.panel.set_running(False)
        if failure.cancelled:
            self.panel.set_summary("Cancelled before the first token: nothing to draw.")
            self.host.status.show("Decode cancelled.")
        else:
            self.panel.set_summary(f"Stopped: {failure.message}")
            self.host.error("Could not decode", failure.message)

    def _on_engine_result(self, result: JobResult) -> None:
        """An opened session file replaced the prefill this timeline was decoded from."""
        if result.kind == OPEN and (self.panel.has_data() or self.running):
            self.clear("a session was opened")
            self.panel.set_summary(
                "Cleared: a session was opened, and the timeline was decoded from another prefill."
            )

    def clear(self, reason: str) -> str:
        """Forget the timeline (cancelling a decode in flight); what to tell the user ("" if there was none)."""
        had = self.panel.has_data() or self.running
        if self.running:
            self.cancel()
            self.request_id = None
            self.panel.set_running(False)
        self.panel.clear()
        return f"The decoding timeline was cleared: {reason}." if had else ""

    # -- the heatmap at a step --------------------------------------------------------------------------

    def show_step(self, step: int) -> None:
        """Draw the cache at decode `step` in the main heatmap: every (layer, kv-head), the positions written."""
        view = self.panel.view()
        if view is None:
            return
        kept = self.panel.kept_rows(step)
        n_layers, n_heads = view.n_layers, view.n_kv_heads
        whole = set(view.timeline.whole_layers)
        labels = [
            f"L{layer} h{h}" + (" ✕" if layer in whole else "")
            for layer in range(n_layers)
            for h in range(n_heads)
        ]
        heatmap = self.host.heatmap
        heatmap.set_data(
            kept,
            labels,
            view.token_texts[: kept.shape[1]],
            None,
            None,
            n_layers,
            n_heads,
            view.not_compressible_labels,
        )
        heatmap.set_boundary(None)
        heatmap.set_title(
            f"The cache at decode step {step:,} of {view.timeline.n_steps:,} · {policy_text(view.policy)} "
            "(Timeline)"
        )
        self.host.status.show(
            f"Heatmap: the cache at decode step {step:,} of {view.timeline.n_steps:,} "
            f"({view.policy['method']}, budget {view.policy['budget']}); a recompress shows the prefill again."
        )

    # -- exports --------------------------------------------------------------------------------------

    def export_image(self, path: str | Path, width: int | None = None) -> bool:
        return export_plot(
            self.host, self.panel, path, "timeline", empty=not self.panel.has_data(), width=width
        )

    def export_csv(self, path: str | Path) -> bool:
        """Write (step, layer, kv_head, position, kept) rows; a message instead of an exception on failure."""
        view = self.panel.view()
        if view is None:
            self.host.error("Nothing to export", "Decode first: the timeline is empty.")
            return False
        try:
            n = write_timeline_csv(path, view.timeline)
        except OSError as exc:
            self.host.error("Export failed", f"Could not write {path}: {exc.strerror or exc}")
            return False
        self.host.status.show(f"Exported {n:,} timeline rows to {path}")
        return True

    def export_image_dialog(self) -> None:
        chosen = ask_image_path(self.host.widget, "timeline", "kvlens_timeline", self.host.settings)
        if chosen:
            self.export_image(*chosen)

    def export_csv_dialog(self) -> None:
        path, _ = save_path(
            self.host.widget,
            self.host.settings,
            STATS,
            "Export timeline",
            "kvlens_timeline.csv",
            "CSV (*.csv)",
        )
        if path:
            self.export_csv(path)
