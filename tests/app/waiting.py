"""Wait for the real window to reach a state while the Qt event loop keeps running."""

import time

from PySide6.QtTest import QTest


def wait_until(condition, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for the window")
        QTest.qWait(10)
