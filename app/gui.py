"""Start the Qt application; kept apart from __main__ so the CLI path never imports Qt."""

from __future__ import annotations

import sys


def run_gui(model: str | None = None) -> int:
    from PySide6.QtWidgets import QApplication

    from app.window.main_window import MainWindow

    qapp = QApplication.instance() or QApplication(sys.argv)
    qapp.setApplicationName("KV Lens")
    qapp.setOrganizationName("KV Lens")
    window = MainWindow(model=model)
    window.show()
    return qapp.exec()
