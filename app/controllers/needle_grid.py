"""The Needle grid dock's behaviour: build the probes (kvcore.probes.needle_grid) and caches, run them on the engine
thread on a session of their own, paint each cell as it finishes, cancel, export PNG/SVG and the CSV of
`kvlens probe`, and open a clicked cell's prompt and cache in the main view (a prefill of that prompt).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget

from app.controllers.file_dialogs import PROBES, save_path
from app.controllers.host import Host, baseline_dtype, show_run_dock
from app.controllers.plot_exports import ask_image_path, export_plot, export_rows
from app.engine import jobs
from app.engine.thread import JobFailure, JobResult
from app.widgets.config_text import config_label, parse_bits
from app.widgets.needle_panel import NeedlePanel
from kvcore.engine.session import CompressionConfig
from kvcore.engine.sweep import check_group_size, grid, parse_ratios
from kvcore.probes.needle_grid import GridCell, grid_specs
from kvcore.probes.scoring import DENSE, PROBE_COLUMNS

NEEDLE_SHORTCUT = "Ctrl+Shift+N"


class NeedleController:
    """Owns the grid in flight: its probes, caches (dense first) and finished cells."""

    def __init__(self, host: Host, panel: NeedlePanel, dock: QDockWidget) -> None:
        self.host = host
        self.panel, self.dock = panel, dock
        self.view = self.panel.grid
        self.request_id: int | None = None
        self.specs: list[dict] = []
        self.configs: list[CompressionConfig] = []
        self.cells: dict[int, GridCell] = {}
        self.panel.runRequested.connect(self.run)
        self.panel.cancelRequested.connect(lambda: host.engine.cancel(jobs.NEEDLES))
        self.panel.exportCsvRequested.connect(self.export_csv_dialog)
        self.panel.exportImageRequested.connect(self.export_image_dialog)
        self.view.cellClicked.connect(self.open_cell)
        self.view.hoverInfo.connect(host.status.show_hover)
        self.show_action = QAction("&Needle Grid", host.widget)
        self.show_action.setShortcut(QKeySequence(NEEDLE_SHORTCUT))
        self.show_action.setStatusTip("Show the Needle grid dock: recall by needle depth and prompt length")
        self.show_action.triggered.connect(lambda _=False: self.show_dock())
        host.widget.addAction(self.show_action)

    @property
    def running(self) -> bool:
        return self.request_id is not None

    def show_dock(self) -> None:
        show_run_dock(self.host.widget, self.dock)

    def run(self) -> int | None:
        """Start the grid; a message naming the problem instead when the input cannot run."""
        w, p = self.host, self.panel
        if self.running:
            w.status.show("A needle grid is running: Cancel it first.")
            return None
        if w.model_info is None:
            w.error("No model loaded", "Load a model before running a needle grid.")
            return None
        try:
            specs = grid_specs(p.family(), p.seedSpin.value(), p.depthsEdit.text(), p.lengthsEdit.text())
            methods = p.checked_methods()
            if not methods:
                raise ValueError("no method is ticked: tick at least one method")
            base = CompressionConfig.from_dict(w.controls.config())
            ratios, bits = parse_ratios(p.ratiosEdit.text()), parse_bits(p.bitsEdit.text())
            configs = grid(methods, ratios, bits, base.group_size, base=base)
            check_group_size(configs, w.model_info.head_dim, w.model_info.value_dim)
        except ValueError as exc:
            w.error("Cannot run the needle grid", str(exc))
            return None
        self.specs, self.configs, self.cells = specs, configs, {}
        depths = sorted({s["depth"] for s in specs})
        lengths = sorted({s["n_tokens"] for s in specs})
        self._depths, self._lengths = depths, lengths
        baseline = baseline_dtype(w)
        self.view.set_grid(
            ["dense", *(config_label(c.to_dict(), baseline) for c in configs)], depths, lengths
        )
        p.set_running(True, len(specs))
        self.request_id = w.engine.submit(
            jobs.NEEDLES,
            jobs.needle_grid(specs, [c.to_dict() for c in configs]),
            on_result=self.on_finished,
            on_failure=self.on_failed,
            on_partial=self._on_partial,
        )
        self.show_dock()
        return self.request_id

    def _on_partial(self, result: JobResult) -> None:
        if result.request_id != self.request_id:
            return
        cell: GridCell = result.value
        self.cells[cell.index] = cell
        li, di = self._lengths.index(cell.probe.n_tokens), self._depths.index(cell.probe.depth)
        self.view.set_cell(li, di, cell.recalled)
        self.panel.progressBar.setValue(len(self.cells))
        self.panel.statusLabel.setText(f"{len(self.cells)} of {len(self.specs)} probes")

    def on_finished(self, result: JobResult) -> None:
        if result.request_id == self.request_id:
            self._stopped(f"{len(self.cells)} probes in {result.seconds:.1f} s; click a cell to open it.")

    def on_failed(self, failure: JobFailure) -> None:
        if failure.request_id != self.request_id:
            return
        if failure.cancelled:
            self._stopped(f"Cancelled after {len(self.cells)} of {len(self.specs)} probes; they stay.")
        else:
            self._stopped(f"Stopped: {failure.message}")
            self.host.error("Needle grid failed", failure.message)

    def _stopped(self, text: str) -> None:
        self.request_id = None
        self.panel.set_running(False)
        self.panel.statusLabel.setText(text)

    def cell(self, length_index: int, depth_index: int) -> GridCell | None:
        n, d = self._lengths[length_index], self._depths[depth_index]
        return next((c for c in self.cells.values() if (c.probe.n_tokens, c.probe.depth) == (n, d)), None)

    def open_cell(self, panel: int, length_index: int, depth_index: int) -> int | None:
        """Put the cell's prompt in the editor, set the controls to its cache (dense = full) and prefill."""
        cell = self.cell(length_index, depth_index)
        if cell is None:
            self.host.status.show("That probe has not run yet.")
            return None
        w = self.host
        config = {"method": "full", "ratio": 1.0} if panel == 0 else self.configs[panel - 1].to_dict()
        w.controls.set_config(config)
        w.sessionPanel.promptEdit.setPlainText(cell.probe.prompt)
        rid = w.prefill()
        what = DENSE if panel == 0 else config_label(config, baseline_dtype(w))
        w.status.show(
            f"Opened the {cell.probe.family} probe at depth {cell.probe.depth:g}, {cell.probe.n_tokens} tokens, {what}."
        )
        return rid

    def rows(self) -> list[dict]:
        return [row for i in sorted(self.cells) for row in self.cells[i].rows]

    def export_csv(self, path: str | Path) -> bool:
        if not export_rows(
            self.host, path, self.rows(), PROBE_COLUMNS, "Run a needle grid first: it is empty."
        ):
            return False
        self.host.status.show(f"Exported {len(self.rows())} needle rows to {path}")
        return True

    def export_image(self, path: str | Path, width: int | None = None) -> bool:
        if not self.view.has_data():
            self.host.error("Nothing to export", "Run a needle grid first: it is empty.")
            return False
        return export_plot(self.host, self.view, path, "needle grid", empty=False, width=width)

    def export_csv_dialog(self) -> None:
        path, _ = save_path(
            self.host.widget,
            self.host.settings,
            PROBES,
            "Export needle grid",
            "kvlens_probe.csv",
            "CSV (*.csv)",
        )
        if path:
            self.export_csv(path)

    def export_image_dialog(self) -> None:
        chosen = ask_image_path(self.host.widget, "needle grid", "kvlens_needle_grid", self.host.settings)
        if chosen:
            self.export_image(*chosen)
