"""Start the Qt application; kept apart from __main__ so the CLI path never imports Qt."""

from __future__ import annotations

import os
import signal
import socket
import sys
from typing import Any


def _quit_on_signals(window: Any) -> tuple[Any, ...]:
    """SIGINT (Ctrl+C in the terminal) and SIGTERM quit as File ▸ Quit does: the window closes, the settings are
    saved, a running job is cancelled or abandoned, and the exit status is 0. Python runs a handler only between
    bytecodes, and the Qt loop runs none, so the signal also wakes the loop through a socket (set_wakeup_fd).
    Returns what must stay alive while the loop runs."""
    from PySide6.QtCore import QSocketNotifier, QTimer

    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno())
    notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read, window)
    notifier.activated.connect(lambda *_: reader.recv(64))

    def quit_(signum: int, frame: Any) -> None:
        QTimer.singleShot(0, window.close)

    signal.signal(signal.SIGINT, quit_)
    signal.signal(signal.SIGTERM, quit_)
    return reader, writer, notifier


def run_gui(model: str | None = None) -> int:
    from PySide6.QtWidgets import QApplication

    from app.engine.thread import abandoned_running
    from app.window.main_window import MainWindow

    qapp = QApplication.instance() or QApplication(sys.argv)
    qapp.setApplicationName("KV Lens")
    qapp.setOrganizationName("KV Lens")
    window = MainWindow(model=model)
    keep = _quit_on_signals(window)
    window.show()
    code = qapp.exec()
    del keep
    if abandoned_running():  # a model load cannot be interrupted; the settings are saved: end without it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
