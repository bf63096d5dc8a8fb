"""Main window (placeholder until the app issue lands)."""

from __future__ import annotations

from PySide6.QtWidgets import QMainWindow


class MainWindow(QMainWindow):
    def __init__(self, model: str | None = None) -> None:
        super().__init__()
        self.setWindowTitle("KV Lens")
        self.resize(1200, 800)
