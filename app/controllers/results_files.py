"""File ▸ Open Results…: a prompt-set results file (`kvlens sweep/probe --prompts`) in the Sweep dock's frontier.

The file is read and checked whole (kvcore.sets.results_file: numpy only, no MLX, so on the GUI thread) before the plot
changes; a bad one leaves the session and the plot as they were and a dialog names the problem and the fix.
"""

from __future__ import annotations

from pathlib import Path

from app.controllers.file_dialogs import RESULTS, open_path
from app.controllers.host import Host
from app.controllers.sweep import SweepController
from kvcore.sets.results_file import read_results

OPEN_RESULTS_SHORTCUT = "Ctrl+Shift+R"
FILTER = "Prompt-set results (*.csv *.json);;All files (*)"


class ResultsFiles:
    """The Open Results action, its recent files, and what an open does to the frontier plot."""

    def __init__(self, host: Host, sweeping: SweepController) -> None:
        self.host = host
        self.sweeping = sweeping
        self.last_opened: str | None = None

    def open_dialog(self) -> None:
        path = open_path(self.host.widget, self.host.settings, RESULTS, "Open prompt-set results", FILTER)
        if path:
            self.open(path)

    def open(self, path: str | Path) -> bool:
        """Show `path`'s configurations in the frontier plot; False (and a dialog) when it cannot."""
        w, sweeping = self.host, self.sweeping
        if sweeping.running:
            w.error("Cannot open the results", "A sweep is drawing in the frontier plot: cancel it first.")
            return False
        try:
            points = read_results(path)
        except ValueError as exc:
            w.error("Could not open the results file", str(exc))
            return False
        sweeping.show_results(points, path)
        resolved = str(Path(path).resolve())
        self.last_opened = resolved
        w.settings.add_recent_results(resolved)
        w.rebuild_recent_menus()
        plot = sweeping.plot
        w.status.show(
            f"Opened {path}: {len(points)} configurations, {len(plot.frontier())} on the Pareto frontier."
        )
        return True
