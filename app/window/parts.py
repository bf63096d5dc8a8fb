"""The main window's smaller pieces: menus and shortcuts, the statistics pane.

Kept apart from main_window.py so that file reads as the request/result flow only. The menus name what they
need of the window as a protocol (MenuOwner), so this module does not import the window that imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QDockWidget,
    QHBoxLayout,
    QMainWindow,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.controllers.needle_grid import NeedleController
from app.controllers.pinning import PinController
from app.controllers.questions import QuestionsController
from app.controllers.results_files import OPEN_RESULTS_SHORTCUT, ResultsFiles
from app.controllers.session_files import OPEN_SHORTCUT, SAVE_SHORTCUT, SessionFiles
from app.controllers.sweep import SweepController
from app.controllers.timeline import TimelineController
from app.settings import Settings
from app.widgets.stats_table import StatsTable
from app.window.layout import RESET_LAYOUT_SHORTCUT
from kvcore import __version__


class MenuOwner(Protocol):
    """What the menus open, run and show of the window (MainWindow implements it)."""

    settings: Settings
    session_files: SessionFiles
    results_files: ResultsFiles
    sweeping: SweepController
    needles: NeedleController
    questioning: QuestionsController
    timeline: TimelineController
    pinning: PinController

    @property
    def widget(self) -> QMainWindow: ...

    def docks(self) -> list[QDockWidget]: ...

    def load_model(self, spec: str) -> int | None: ...

    def open_model_dialog(self) -> None: ...

    def export_csv_dialog(self) -> None: ...

    def export_image_dialog(self) -> None: ...

    def prefill(self, prompt: str | None = None) -> int | None: ...

    def step(self) -> int | None: ...

    def generate(self, n: int | None = None) -> int | None: ...

    def cancel(self) -> None: ...

    def reset_layout(self) -> None: ...


class StatsPane(QWidget):
    """The per-(layer, kv-head) table with its export buttons."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("statsPane")
        self.table = StatsTable()
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        self.exportCsvButton = QPushButton("Export CSV…", objectName="exportCsvButton")
        keys = QKeySequence("Ctrl+E").toString(QKeySequence.SequenceFormat.NativeText)
        self.exportCsvButton.setToolTip(f"Save the table as CSV ({keys})")
        self.exportImageButton = QPushButton("Export heatmap image…", objectName="exportImageButton")
        self.exportImageButton.setToolTip("Save the heatmap as PNG or SVG")
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.exportImageButton)
        buttons.addWidget(self.exportCsvButton)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)


@dataclass
class WindowActions:
    """The menu actions, so tests and the window can trigger or inspect them."""

    open_model: QAction
    open_session: QAction
    save_session: QAction
    recent_sessions: QMenu
    open_results: QAction
    recent_results: QMenu
    recent_menu: QMenu
    export_csv: QAction
    export_image: QAction
    quit: QAction
    prefill: QAction
    step: QAction
    generate: QAction
    cancel: QAction
    reset_layout: QAction
    owner: MenuOwner

    def rebuild_recent(self, models: list[str]) -> None:
        """Refill File ▸ Open Recent."""
        _fill(self.recent_menu, models, self.owner.load_model)

    def rebuild_recent_sessions(self, paths: list[str]) -> None:
        """Refill File ▸ Open Recent Session."""
        _fill(self.recent_sessions, paths, self.owner.session_files.open)

    def rebuild_recent_results(self, paths: list[str]) -> None:
        """Refill File ▸ Open Recent Results."""
        _fill(self.recent_results, paths, self.owner.results_files.open)


def _fill(menu: QMenu, items: list[str], open_item: Callable[[str], object]) -> None:
    """One action per item, newest first, each opening its item; the menu greyed out when empty."""
    menu.clear()
    for item in items:
        action = menu.addAction(item)
        action.triggered.connect(lambda _=False, i=item: open_item(i))
    menu.setEnabled(bool(items))


def _action(
    window: QWidget, text: str, slot, shortcut: QKeySequence | str | None = None, tip: str = ""
) -> QAction:  # noqa: ANN001
    action = QAction(text, window)
    if shortcut is not None:
        action.setShortcut(QKeySequence(shortcut))
    action.setStatusTip(tip)
    action.triggered.connect(lambda _=False: slot())
    window.addAction(action)
    return action


def build_menus(owner: MenuOwner) -> WindowActions:
    """File, Session, View, Compare and Help menus with the shortcuts a Mac user expects (Ctrl is Cmd there)."""
    window = owner.widget
    bar = window.menuBar()
    file_menu = bar.addMenu("&File")
    open_model = _action(window, "&Open Model Folder…", owner.open_model_dialog, "Ctrl+Shift+O")
    file_menu.addAction(open_model)
    recent_menu = file_menu.addMenu("Open &Recent")
    file_menu.addSeparator()
    files = owner.session_files
    open_session = _action(
        window, "Open &Session…", files.open_dialog, OPEN_SHORTCUT, "Open a saved prefill: no new prefill"
    )
    save_session = _action(
        window, "&Save Session…", files.save_dialog, SAVE_SHORTCUT, "Keep this prefill and view in a file"
    )
    file_menu.addAction(open_session)
    recent_sessions = file_menu.addMenu("Open Recent Sessio&n")
    file_menu.addAction(save_session)
    file_menu.addSeparator()
    open_results = _action(
        window,
        "Open Resul&ts…",
        owner.results_files.open_dialog,
        OPEN_RESULTS_SHORTCUT,
        "Show a prompt-set results file (kvlens sweep --prompts) on the frontier, with intervals",
    )
    file_menu.addAction(open_results)
    recent_results = file_menu.addMenu("Open Recent Res&ults")
    file_menu.addSeparator()
    export_csv = _action(
        window, "Export &CSV…", owner.export_csv_dialog, "Ctrl+E", "Save the statistics table"
    )
    export_image = _action(
        window, "Export &Image…", owner.export_image_dialog, "Ctrl+Shift+E", "Save the heatmap as PNG or SVG"
    )
    file_menu.addAction(export_csv)
    file_menu.addAction(export_image)
    file_menu.addSeparator()
    quit_action = _action(window, "&Quit", window.close, "Ctrl+Q")
    quit_action.setMenuRole(QAction.MenuRole.QuitRole)
    file_menu.addAction(quit_action)

    session_menu = bar.addMenu("&Session")
    prefill = _action(window, "&Prefill", owner.prefill, "Ctrl+Return", "Prefill the prompt, then compress")
    prefill.setShortcuts([QKeySequence("Ctrl+Return"), QKeySequence("Ctrl+Enter")])
    step = _action(
        window, "&Step", owner.step, "Right", "Generate one more token (→ when no editor has focus)"
    )
    generate = _action(
        window, "&Generate N", owner.generate, "Ctrl+G", "Generate the panel's count of tokens"
    )
    cancel = _action(window, "&Cancel", owner.cancel, "Esc", "Stop the running job")
    for action in (prefill, step, generate, cancel):
        session_menu.addAction(action)

    view_menu = bar.addMenu("&View")
    for dock in owner.docks():
        view_menu.addAction(dock.toggleViewAction())
    view_menu.addSeparator()
    view_menu.addAction(owner.sweeping.show_action)
    view_menu.addAction(owner.needles.show_action)
    view_menu.addAction(owner.questioning.show_action)
    view_menu.addAction(owner.timeline.show_action)
    view_menu.addSeparator()
    reset_layout = _action(
        window,
        "&Reset Layout",
        owner.reset_layout,
        RESET_LAYOUT_SHORTCUT,
        "Put every panel back in its place and fit the window to the screen",
    )
    view_menu.addAction(reset_layout)

    compare_menu = bar.addMenu("&Compare")
    for action in owner.pinning.actions:
        compare_menu.addAction(action)

    help_menu = bar.addMenu("&Help")
    about = _action(window, "&About KV Lens", lambda: _about(window))
    about.setMenuRole(QAction.MenuRole.AboutRole)
    help_menu.addAction(about)

    actions = WindowActions(
        open_model,
        open_session,
        save_session,
        recent_sessions,
        open_results,
        recent_results,
        recent_menu,
        export_csv,
        export_image,
        quit_action,
        prefill,
        step,
        generate,
        cancel,
        reset_layout,
        owner,
    )
    actions.rebuild_recent(owner.settings.recent_models)
    actions.rebuild_recent_sessions(owner.settings.recent_sessions)
    actions.rebuild_recent_results(owner.settings.recent_results)
    return actions


def _about(window: QWidget) -> None:
    QMessageBox.about(
        window,
        "About KV Lens",
        f"<b>KV Lens {__version__}</b><p>See which positions every layer and kv-head of an mlx-lm model keeps "
        "under KV-cache compression, and what it costs in memory and quality.</p>",
    )
