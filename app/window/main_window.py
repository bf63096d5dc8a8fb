"""The main window: docks the widgets around the heatmap and runs every request on the engine thread.

The GUI never touches MLX or the Session: it submits jobs (app.engine.jobs) and shows the plain results they return.
Slider moves submit a coalescing "compress" job; a result is shown only while its request is still the newest
of its kind, so a burst of moves ends on the last setting and nothing stale is drawn after it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QCloseEvent, QIcon, QKeySequence, QShowEvent
from PySide6.QtWidgets import QApplication, QDockWidget, QMainWindow, QMessageBox, QWidget

from app.controllers import file_dialogs
from app.controllers.needle_grid import NeedleController
from app.controllers.pinning import PinController
from app.controllers.plot_exports import ask_image_path, export_plot, export_rows
from app.controllers.questions import QuestionsController
from app.controllers.results_files import OPEN_RESULTS, ResultsFiles
from app.controllers.session_files import OPEN, SAVE, SessionFiles
from app.controllers.stored_form import StoredFormController
from app.controllers.sweep import SweepController
from app.controllers.timeline import TimelineController
from app.engine import jobs
from app.engine.jobs import COMPRESS, EXTEND, LOAD, NEEDLES, PREFILL, SWEEP
from app.engine.question_jobs import QUESTION_ATTENTION, QUESTIONS
from app.engine.thread import EngineThread, JobFailure, JobResult
from app.engine.timeline_jobs import DECODE
from app.engine.view_model import CompressionView, LoadedModel, SequenceView
from app.settings import Settings
from app.widgets.comparison import ComparisonView, MetricsPanel
from app.widgets.controls import DEFAULTS, CompressionControls
from app.widgets.heatmap import RetentionHeatmap
from app.widgets.needle_panel import NeedlePanel
from app.widgets.questions_panel import QuestionsPanel
from app.widgets.scrolling import scrolled
from app.widgets.session_panel import SessionPanel, find_cached_models
from app.widgets.status_area import StatusArea
from app.widgets.stored_form import StoredFormPanel
from app.widgets.sweep_panel import SweepPanel
from app.widgets.timeline import TimelinePanel
from app.window import layout
from app.window.arrow_keys import ArrowKeyGuard
from app.window.parts import StatsPane, build_menus
from kvcore.defaults import DEFAULT_CONTINUATION_TOKENS
from kvcore.model import checks as model_checks
from kvcore.resources import demo_model_dir, prompts_dir, resources_dir

DEFAULT_SIZE = layout.LAPTOP_SIZE
#: Jobs long enough that the run buttons wait for them (a recompress does not block Prefill).
LONG_KINDS = {
    LOAD: "Loading model",
    PREFILL: "Prefilling",
    EXTEND: "Generating",
    SWEEP: "Sweeping",
    NEEDLES: "Running the needle grid",
    OPEN: "Opening the session",
    OPEN_RESULTS: "Opening the results",
    SAVE: "Saving the session",
    QUESTIONS: "Answering the questions",
    QUESTION_ATTENTION: "Measuring the question's attention",
    DECODE: "Decoding",
}


def native_shortcut(keys: str) -> str:
    """How the platform writes a shortcut (⌘↩ on a Mac, Ctrl+Return elsewhere)."""
    return QKeySequence(keys).toString(QKeySequence.SequenceFormat.NativeText)


def default_model() -> str | None:
    """The bundled demo model's folder, when it is there."""
    folder = demo_model_dir()
    return str(folder) if (folder / "config.json").is_file() else None


class MainWindow(QMainWindow):
    """KV Lens: session panel left, heatmap centre, controls and metrics right, text and table below.

    Its controllers see it as an app.controllers.host.Host; each job it submits carries its own callbacks."""

    def __init__(
        self,
        model: str | None = None,
        settings_path: str | Path | None = None,
        continuation_tokens: int = DEFAULT_CONTINUATION_TOKENS,
    ) -> None:
        super().__init__()
        self.setWindowTitle("KV Lens")
        self.resize(*DEFAULT_SIZE)
        icon = resources_dir() / "icons" / "kvlens.png"
        if icon.is_file():
            self.setWindowIcon(QIcon(str(icon)))
        self.settings, settings_warning = Settings.load(settings_path)
        self.continuation_tokens = continuation_tokens
        self.displayed_ids: list[int] = []  # every compress request id drawn, in order (tests assert on it)
        self.last_error: str | None = None
        self.model_info = None
        self.prefilled = False  # a prefill was asked for and stands (Host.prefilled)
        self._message_box: QMessageBox | None = None
        self._shut_down = False
        self._restored_size = None  # the size settings gave, until the first show

        self.engine = EngineThread(self)
        self.engine.progressed.connect(self._on_progress)
        self.engine.busyChanged.connect(self._on_busy)
        self.engine.start()
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shut_down)

        self._build_ui()
        self.sweeping = SweepController(self, self.sweepPanel, self.sweepDock)
        self.needles = NeedleController(self, self.needlePanel, self.needleDock)
        self.questioning = QuestionsController(self, self.questionsPanel, self.questionsDock)
        self.sweeping.questions = self.questioning.for_sweep
        self.timeline = TimelineController(self, self.timelinePanel, self.timelineDock)
        self.pinning = PinController(self)
        self.stored_form = StoredFormController(self, self.storedPanel, self.storedDock)
        self.session_files = SessionFiles(self, self.pinning, self.sweeping)
        self.results_files = ResultsFiles(self, self.sweeping)
        self.actions_ = build_menus(self)
        self._guard = ArrowKeyGuard(self)
        self._guard.protect(self)
        settings_warning = self._restore_settings() or settings_warning

        start = model or default_model()
        if settings_warning:
            self.status.warn(settings_warning)
        if start:
            self.load_model(start)
        elif not settings_warning:
            self.status.show("No model yet: choose one in the Session panel or File ▸ Open model folder…")

    # -- layout ---------------------------------------------------------------------------------------

    def _build_ui(self) -> None:
        self.heatmap = RetentionHeatmap()
        self.setCentralWidget(self.heatmap)
        self.sessionPanel = SessionPanel(
            demo_model=default_model(), recent_models=self.settings.recent_models, prompts_dir=prompts_dir()
        )
        self.controls = CompressionControls()
        self.comparison = ComparisonView()
        self.metricsPanel = MetricsPanel()
        self.statsPane = StatsPane()
        self.statsTable = self.statsPane.table
        self.exportCsvButton = self.statsPane.exportCsvButton
        self.status = StatusArea(self.statusBar())

        self.sessionDock = self._dock("Session", self.sessionPanel)
        self.controlsDock = self._dock("Compression", self.controls)
        self.metricsDock = self._dock("Metrics", self.metricsPanel)
        self.comparisonDock = self._dock("Continuations", self.comparison)
        self.statsDock = self._dock("Statistics", self.statsPane)
        self.sweepPanel = SweepPanel()
        self.sweepDock = self._dock("Sweep", self.sweepPanel, scroll=False)
        self.needlePanel = NeedlePanel()
        self.needleDock = self._dock("Needle grid", self.needlePanel, scroll=False)
        self.questionsPanel = QuestionsPanel()
        self.questionsDock = self._dock("Questions", self.questionsPanel, scroll=False)
        self.timelinePanel = TimelinePanel()
        self.timelineDock = self._dock("Timeline", self.timelinePanel, scroll=False)
        self.storedPanel = StoredFormPanel()
        self.storedDock = self._dock("Stored form", self.storedPanel, scroll=False)
        layout.arrange_docks(self)

        panel = self.sessionPanel
        panel.loadRequested.connect(self.load_model)
        panel.prefillRequested.connect(self.prefill)
        panel.stepRequested.connect(self.step)
        panel.generateRequested.connect(self.generate)
        panel.cancelRequested.connect(self.cancel)
        panel.tokenHovered.connect(self._on_token_hovered)
        self.controls.configChanged.connect(self.request_compression)
        self.controls.methodCombo.currentIndexChanged.connect(self._on_method_changed)
        self.controls.autoRegenerateCheck.toggled.connect(self.request_compression)
        self.heatmap.hoverInfo.connect(self.status.show_hover)
        self.storedPanel.hoverInfo.connect(self.status.show_hover)
        self.exportCsvButton.clicked.connect(self.export_csv_dialog)
        self.statsPane.exportImageButton.clicked.connect(self.export_image_dialog)
        self.comparison.strip.exportButton.clicked.connect(self.export_strip_dialog)

    @property
    def widget(self) -> QMainWindow:
        """The window as a Qt parent (Host.widget): itself."""
        return self

    def docks(self) -> list[QDockWidget]:
        """The docks in the order the View menu lists them."""
        return [
            self.sessionDock,
            self.controlsDock,
            self.metricsDock,
            self.comparisonDock,
            self.statsDock,
            self.sweepDock,
            self.needleDock,
            self.questionsDock,
            self.timelineDock,
            self.storedDock,
        ]

    def _dock(self, title: str, widget: QWidget, scroll: bool = True) -> QDockWidget:
        """A movable, closable dock holding `widget`, in a scroll area unless it scrolls its own parts (the run
        panels: their form and their grid scroll, their plot shrinks); layout.arrange_docks places it."""
        dock = QDockWidget(title, self, objectName=f"{widget.objectName() or title}Dock")
        dock.setWidget(scrolled(widget) if scroll else widget)
        dock.setFeatures(
            QDockWidget.DockWidgetFeature.DockWidgetMovable | QDockWidget.DockWidgetFeature.DockWidgetClosable
        )
        return dock

    def reset_layout(self) -> None:
        """View ▸ Reset Layout: every dock back in its default place, the window clamped to its screen."""
        layout.arrange_docks(self)
        layout.clamp_to_screen(self)

    # -- requests (GUI thread; each becomes a job) -----------------------------------------------------

    def load_model(self, spec: str) -> int | None:
        """Load a model folder, cached model or repo id; the current session stays until it succeeds."""
        spec = str(spec).strip()
        if not spec:
            self.error("No model chosen", "Choose a model folder, a cached model or the demo model.")
            return None
        return self.engine.submit(
            LOAD, jobs.load(spec), on_result=self._on_loaded, on_failure=self._on_failed
        )

    def prefill(self, prompt: str | None = None) -> int | None:
        """Prefill `prompt` (default: the editor's text), then compress and regenerate with the controls."""
        text = self.sessionPanel.promptEdit.toPlainText() if prompt is None else prompt
        if not text.strip():
            self.error("Empty prompt", "Type a prompt (or pick a sample prompt) before Prefill.")
            return None
        if self.model_info is None and self.engine.latest_id(LOAD) is None:
            self.error("No model loaded", "Load a model before Prefill.")
            return None
        info = self.model_info
        refusal = info and model_checks.quantized_kv_refusal(
            info.model_type, info.attention_sinks, bool(info.latent_rope_dim)
        )
        if refusal and self.controls.quantized():
            self.error("Quantized KV is not possible", refusal)
            return None
        use_template, system = self.sessionPanel.chat_template()
        rid = self.engine.submit(
            PREFILL,
            jobs.prefill(
                text, self.continuation_tokens, use_template, system, self.sessionPanel.beyond_context()
            ),
            on_result=self._on_prefilled,
            on_failure=self._on_failed,
        )
        self.prefilled = True
        self.request_compression()
        return rid

    def step(self) -> int | None:
        """Extend the dense continuation by one token and recompress."""
        return self.generate(1)

    def generate(self, n: int | None = None) -> int | None:
        """Extend the dense continuation by n tokens (default: the panel's count) and recompress."""
        if not self.prefilled:
            self.status.show("Prefill a prompt first.")
            return None
        n = self.sessionPanel.generateCountSpin.value() if n is None else int(n)
        rid = self.engine.submit(
            EXTEND,
            jobs.extend(n, self.sessionPanel.beyond_context()),
            on_result=self._on_extended,
            on_failure=self._on_failed,
        )
        self.request_compression()
        return rid

    def request_compression(self, *_: Any, regenerate: bool | None = None) -> int | None:
        """Recompress with the current controls (coalesced: a newer request replaces a pending one); regenerate
        as the Auto-regenerate box says unless `regenerate` is given."""
        if not self.prefilled:
            return None
        engine = self.engine
        job = jobs.compress(
            self.controls.config(),
            self.controls.auto_regenerate() if regenerate is None else regenerate,
            is_current=lambda rid: engine.is_current(rid, COMPRESS),
        )
        return self.engine.submit(
            COMPRESS, job, coalesce=True, on_result=self._on_compressed, on_failure=self._on_failed
        )

    def cancel(self) -> None:
        """Stop the running job and drop the queued ones."""
        self.engine.cancel()
        self.questioning.cancel()
        self.status.show("Cancelling…")

    # -- exports ---------------------------------------------------------------------------------------

    def export_csv(self, path: str | Path) -> bool:
        """Write the statistics table (as shown) to `path`; a message instead of an exception on failure."""
        rows = self.statsTable.rows()
        empty = "Prefill a prompt first: the statistics table is empty."
        if not export_rows(self, path, rows, self.statsTable.columns(), empty):
            return False
        self.status.show(f"Exported {len(rows)} rows to {path}")
        return True

    def export_image(self, path: str | Path, width: int | None = None) -> bool:
        """Write the heatmap as PNG (`width` pixels wide) or SVG, by suffix."""
        empty = self.heatmap.image_rgba().size == 0
        return export_plot(self, self.heatmap, path, "heatmap", empty=empty, width=width)

    def export_strip_image(self, path: str | Path, width: int | None = None) -> bool:
        """Write the per-token strip as PNG (`width` pixels wide) or SVG, by suffix."""
        strip = self.comparison.strip
        return export_plot(self, strip, path, "per-token strip", empty=not strip.has_data(), width=width)

    def export_csv_dialog(self) -> None:
        path, _ = file_dialogs.save_path(
            self, self.settings, file_dialogs.STATS, "Export statistics", "kvlens_stats.csv", "CSV (*.csv)"
        )
        if path:
            self.export_csv(path)

    def export_image_dialog(self) -> None:
        chosen = ask_image_path(self, "heatmap", "kvlens_heatmap", self.settings)
        if chosen:
            self.export_image(*chosen)

    def export_strip_dialog(self) -> None:
        chosen = ask_image_path(self, "per-token strip", "kvlens_per_token", self.settings)
        if chosen:
            self.export_strip_image(*chosen)

    def open_model_dialog(self) -> None:
        folder = file_dialogs.open_folder(self, self.settings, file_dialogs.MODELS, "Open a model folder")
        if folder:
            self.load_model(folder)

    # -- results (GUI thread) --------------------------------------------------------------------------

    # Each runs only while its request is the newest of its kind (EngineThread drops superseded results).

    def _on_loaded(self, result: JobResult) -> None:
        self.prefilled = (self.engine.latest_id(PREFILL) or 0) > result.request_id
        self.show_loaded(result.value)

    def _on_prefilled(self, result: JobResult) -> None:
        seq: SequenceView = result.value
        self.sessionPanel.set_generated(seq.tokens, seq.prompt_len)
        self.prefilled = True
        self.status.set_timing("prefill", seq.prefill_ms)
        cleared = self.pinning.clear("a new prefill has other positions")
        cleared = f"{cleared} {self.sweeping.clear('it was measured on another prefill')}".strip()
        cleared = f"{cleared} {self.timeline.clear('it was decoded from another prefill')}".strip()
        self.status.show(
            f"Prefilled {seq.prompt_len} tokens; the dense continuation is the reference. {cleared}".strip()
        )
        self.questioning.on_prefilled()

    def _on_extended(self, result: JobResult) -> None:
        seq: SequenceView | None = result.value
        if seq is None:  # nothing was prefilled to extend
            return
        self.sessionPanel.set_generated(seq.tokens, seq.prompt_len)
        cleared = self.sweeping.clear("it was measured on a shorter continuation")
        if seq.cut_short:  # the cancel dropped the recompress queued behind it: ask again for what was kept
            self.status.show(f"Generate cancelled; the tokens generated so far are kept. {cleared}".strip())
            self.request_compression()
        elif cleared:
            self.status.show(cleared)

    def _on_compressed(self, result: JobResult) -> None:
        if result.value is not None:
            self.show_compression(result.value)

    def show_loaded(self, loaded: LoadedModel) -> None:
        """Show a model that is now the engine's: title, recent models, controls; what it cleared is said."""
        info = loaded.info
        self.model_info = info
        self.setWindowTitle(f"KV Lens — {info.name}")
        self.settings.add_recent_model(loaded.spec)
        self._refresh_model_list(loaded.spec)
        self.rebuild_recent_menus()
        self.sessionPanel.set_model_loaded(info.name)
        self.sessionPanel.set_chat_template_available(info.has_chat_template)
        self.controls.set_head_dim(info.head_dim, info.value_dim)
        self.controls.set_baseline(info.cache_dtype)
        self.metricsPanel.set_baseline(info.cache_dtype or None)
        cleared = self.pinning.clear("another model was loaded")
        cleared = f"{cleared} {self.sweeping.clear('another model was loaded')}".strip()
        cleared = f"{cleared} {self.timeline.clear('another model was loaded')}".strip()
        self.heatmap.clear()
        self.stored_form.clear()
        self.questionsPanel.clear_answers()
        self.comparison.set_texts([], [], None)
        self.comparison.set_steps(None)
        self.metricsPanel.set_metrics({})
        self.statsTable.set_rows([])
        heads = (
            f"{info.n_q_heads} query heads sharing one latent kv-head of {info.head_dim} + "
            f"{info.latent_rope_dim} RoPE"
            if info.latent_rope_dim
            else f"{info.n_q_heads} query / {info.n_kv_heads} kv-heads of {info.head_dim}"
        )
        self.status.show(
            f"Loaded {info.name}: {info.n_layers} layers, {heads}, "
            f"context {info.max_context or '?'}. Type or pick a prompt and Prefill "
            f"({native_shortcut('Ctrl+Return')}). {cleared}".strip()
        )

    def rebuild_recent_menus(self) -> None:
        """Refill File ▸ Open Recent, Open Recent Session and Open Recent Results from the settings."""
        s = self.settings
        self.actions_.rebuild_recent(s.recent_models)
        self.actions_.rebuild_recent_sessions(s.recent_sessions)
        self.actions_.rebuild_recent_results(s.recent_results)

    def _refresh_model_list(self, selected: str) -> None:
        panel = self.sessionPanel
        panel.set_models(default_model(), self.settings.recent_models, find_cached_models())
        index = panel.modelCombo.findData(selected)
        if index >= 0:
            panel.modelCombo.setCurrentIndex(index)

    def show_compression(self, view: CompressionView) -> None:
        """Draw a compression result in the heatmap, table, metrics and continuations (Host.show_compression)."""
        self.heatmap.set_data(
            view.kept,
            view.row_labels,
            view.token_texts,
            view.scores,
            view.quant_error,
            view.n_layers,
            view.n_kv_heads,
            view.not_compressible_labels,
        )
        self.heatmap.set_boundary(view.n_prompt_positions, view.sequence.prompt_len)
        self.heatmap.set_merge_targets(view.merge_targets)
        channels = view.key_channels
        self.heatmap.set_key_channels(
            None if channels is None else channels.kept.sum(axis=1),
            0 if channels is None else channels.head_dim,
        )
        self.stored_form.show(view)
        fit_columns = not self.statsTable.rows()
        self.statsTable.set_rows(*self.pinning.on_compression(view))
        if fit_columns:
            self.statsTable.resizeColumnsToContents()
        self.metricsPanel.set_metrics(view.metrics)
        self.comparison.set_texts(view.dense_texts, view.compressed_texts or [], view.first_divergence)
        self.comparison.set_steps(view.token_steps)
        self.status.set_timing("recompress", view.metrics.get("recompress_ms"))
        self.status.set_timing("regenerate", view.metrics.get("regenerate_ms"))
        self.controls.set_budget_note(view.budget_note)
        if view.budget_note:
            self.status.warn(view.budget_note)
        if view.not_compressible:
            layers = ", ".join(str(i) for i in view.not_compressible)
            kinds = sorted(set(view.not_compressible_labels.values())) or ["sliding window or state"]
            self.status.show(
                f"Layers {layers} are stored whole ({'; '.join(kinds)}): grey in the heatmap, ✕, and "
                "counted apart in 'Ratio, compressible layers'."
            )
        self.displayed_ids.append(view.request_id)

    def _on_failed(self, failure: JobFailure) -> None:
        """A load, prefill, extend or compress that failed or was cancelled (the window's own jobs)."""
        if failure.kind == PREFILL and self.engine.is_current(failure.request_id, PREFILL):
            self.prefilled = self.pinning.current is not None  # the previous prefill, if any, stays
        if failure.cancelled:
            self.status.show(f"{failure.kind.capitalize()} cancelled.")
            return
        if failure.kind == COMPRESS:
            if self.engine.is_current(failure.request_id, COMPRESS):
                self.last_error = failure.message
                self.status.warn(f"Compression: {failure.message}")
            return
        title = {
            LOAD: "Could not load the model",
            PREFILL: "Could not prefill",
            EXTEND: "Could not generate",
        }
        self.error(title.get(failure.kind, "Error"), failure.message)

    def _on_progress(self, request_id: int, text: str, fraction: float) -> None:
        if text:
            self.sessionPanel.busyLabel.setText(text)
            self.status.set_busy(text)

    def _on_busy(self, busy: bool, kind: str) -> None:
        long_job = busy and kind in LONG_KINDS
        self.sessionPanel.set_busy(long_job, LONG_KINDS.get(kind, "") + "…" if long_job else "")
        self.status.set_busy(
            ("Recompressing…" if kind == COMPRESS else LONG_KINDS.get(kind, kind) + "…") if busy else ""
        )

    def _on_method_changed(self, *_: object) -> None:
        """Another method's budget rule: the last one's fallback note no longer applies."""
        note = self.controls.budgetNoteLabel.text().removeprefix("⚠ ")
        self.controls.set_budget_note(None)
        if note:
            self.status.retract(note)

    def _on_token_hovered(self, position: int) -> None:
        self.heatmap.highlight_position(position if position >= 0 else None)

    def error(self, title: str, text: str) -> None:
        """A clear message in the status bar and a window-modal box that does not block the event loop."""
        self.last_error = text
        self.status.warn(f"{title}: {text}")
        if self._message_box is not None:
            self._message_box.close()
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self)
        box.setObjectName("errorBox")
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.destroyed.connect(lambda *_: self._forget_box(box))
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()
        self._message_box = box

    def _forget_box(self, box: QMessageBox) -> None:
        if self._message_box is box:
            self._message_box = None

    # -- settings --------------------------------------------------------------------------------------

    def _restore_settings(self) -> str | None:
        s = self.settings
        if s.geometry:
            self.restoreGeometry(QByteArray.fromBase64(s.geometry.encode("ascii")))
        layout.clamp_to_screen(self)
        self._restored_size = self.size()
        if s.last_prompt:
            self.sessionPanel.promptEdit.setPlainText(s.last_prompt)
        self.sessionPanel.chatTemplateCheck.setChecked(s.chat_template)
        self.sessionPanel.systemPromptEdit.setText(s.system_prompt)
        self.sessionPanel.beyondContextCheck.setChecked(s.beyond_context)
        last = {
            "method": s.last_method,
            "ratio": s.last_ratio,
            "bits": s.last_bits,
            "value_bits": s.last_value_bits,
            "fp_recent": s.last_fp_recent,
            "group_size": s.last_group_size,
            "schedule": s.last_schedule,
        }
        try:
            self.controls.set_config(last)
        except ValueError as exc:
            self.controls.set_config(DEFAULTS)
            return f"Settings: {exc}; defaults used."
        if self.controls.config()["method"] != s.last_method:
            return f"Settings: unknown method {s.last_method!r}; using {self.controls.config()['method']}."
        return None

    def save_settings(self) -> str | None:
        """Remember geometry, recent models, the prompt and the compression choice; a warning on failure."""
        s, cfg = self.settings, self.controls.config()
        s.geometry = bytes(self.saveGeometry().toBase64().data()).decode("ascii")
        s.last_prompt = self.sessionPanel.promptEdit.toPlainText()
        s.chat_template = self.sessionPanel.chatTemplateCheck.isChecked()
        s.system_prompt = self.sessionPanel.systemPromptEdit.text()
        s.beyond_context = self.sessionPanel.beyond_context()
        s.last_method, s.last_ratio, s.last_bits, s.last_value_bits, s.last_group_size, s.last_schedule = (
            cfg["method"],
            cfg["ratio"],
            cfg["bits"],
            cfg["value_bits"],
            cfg["group_size"],
            cfg["schedule"],
        )
        s.last_fp_recent = cfg["fp_recent"]
        return s.save()

    def shut_down(self) -> None:
        """Save settings and stop the engine thread, once (closing the window or quitting the app)."""
        if self._shut_down:
            return
        self._shut_down = True
        if self._message_box is not None:  # a window-modal box outliving its window blocks every other one
            self._message_box.close()
        warning = self.save_settings()
        if warning:
            self.status.warn(warning)
        self.engine.shutdown()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt API)
        super().showEvent(event)
        # The frame's size is known once shown: clamp the restored (or default) geometry again with it, unless
        # the caller has sized the window since.
        if self._restored_size is not None:
            if self.size() == self._restored_size:
                layout.clamp_to_screen(self)
            layout.size_docks(self)
        self._restored_size = None

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt API)
        self.shut_down()
        super().closeEvent(event)
