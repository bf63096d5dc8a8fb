"""File ▸ Open Results…: a prompt-set results file (`kvlens sweep/probe --prompts`) in the Sweep dock's frontier.

The file is read and checked whole (kvcore.sets.results_file; a per-row file is summarised with its bootstrap
intervals there) on the engine thread, so a large file never freezes the window: the status bar says what is being
read, and the plot changes only when every row was read and checked. A bad file leaves the session and the plot
as they were and a dialog names the problem and the fix.
"""

from __future__ import annotations

from pathlib import Path

from app.controllers.file_dialogs import RESULTS, open_path
from app.controllers.host import Host
from app.controllers.sweep import SweepController
from app.engine.thread import Job, JobContext, JobFailure, JobResult
from kvcore.sets.results_file import ResultPoint, read_results

OPEN_RESULTS_SHORTCUT = "Ctrl+Shift+R"
FILTER = "Prompt-set results (*.csv *.json);;All files (*)"
#: The engine job kind: a newer open supersedes one still reading.
OPEN_RESULTS = "open_results"


def read_job(path: str) -> Job:
    """Read and summarise `path` (no MLX: any thread would do; the engine's keeps the GUI thread free)."""

    def job(ctx: JobContext) -> list[ResultPoint]:
        ctx.progress(0.0, f"Reading and summarising {Path(path).name}…")
        return read_results(path)

    return job


class ResultsFiles:
    """The Open Results action, its recent files, and what an open does to the frontier plot."""

    def __init__(self, host: Host, sweeping: SweepController) -> None:
        self.host = host
        self.sweeping = sweeping
        self.last_opened: str | None = None
        self.opening: int | None = None  # the request id of the file being read, None when none is

    def open_dialog(self) -> None:
        path = open_path(self.host.widget, self.host.settings, RESULTS, "Open prompt-set results", FILTER)
        if path:
            self.open(path)

    def open(self, path: str | Path) -> int | None:
        """Start reading `path` on the engine thread; its configurations reach the frontier plot when it is read
        and checked. The request id, or None (and a dialog) when it cannot start."""
        w = self.host
        if self.sweeping.running:
            w.error("Cannot open the results", "A sweep is drawing in the frontier plot: cancel it first.")
            return None
        w.status.show(f"Opening {path}…")
        self.opening = w.engine.submit(
            OPEN_RESULTS,
            read_job(str(path)),
            on_result=lambda result: self._on_read(result, path),
            on_failure=self._on_failed,
        )
        return self.opening

    def _on_read(self, result: JobResult, path: str | Path) -> None:
        self.opening = None
        w, sweeping = self.host, self.sweeping
        if sweeping.running:  # a sweep started while the file was read: it owns the plot now
            w.status.show(f"Not showing {path}: a sweep is drawing in the frontier plot.")
            return
        points: list[ResultPoint] = result.value
        sweeping.show_results(points, path)
        resolved = str(Path(path).resolve())
        self.last_opened = resolved
        w.settings.add_recent_results(resolved)
        w.rebuild_recent_menus()
        w.status.show(
            f"Opened {path}: {len(points)} configurations, {len(sweeping.plot.frontier())} on the Pareto frontier."
        )

    def _on_failed(self, failure: JobFailure) -> None:
        if self.opening == failure.request_id:
            self.opening = None
        if failure.cancelled:
            self.host.status.show("Opening the results was cancelled; the plot is as it was.")
            return
        self.host.error("Could not open the results file", failure.message)
