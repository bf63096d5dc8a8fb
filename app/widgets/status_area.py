"""The status bar's message area: passing messages, warnings that stay until read, busy state and timings.

A widget helper rather than a window part, so that controllers (app.controllers.host) can name its type.
"""

from __future__ import annotations

import time

from PySide6.QtWidgets import QLabel, QStatusBar

_MESSAGE_MS = 8000
_WARNING_MS = 20000


class StatusArea:
    """Messages (hover info, results, warnings) on the left; busy state and timings as permanent labels."""

    def __init__(self, bar: QStatusBar) -> None:
        self.bar = bar
        self.busyLabel = QLabel(objectName="statusBusyLabel")
        self.timingLabel = QLabel(objectName="statusTimingLabel")
        bar.addPermanentWidget(self.busyLabel)
        bar.addPermanentWidget(self.timingLabel)
        self.last_warning: str | None = None
        self._timings: dict[str, float] = {}
        self._warning_until = 0.0

    def show(self, text: str) -> None:
        """A passing message; it waits while a warning is fresh, so a warning is never wiped unread."""
        if time.monotonic() < self._warning_until:
            return
        self.bar.showMessage(text, _MESSAGE_MS)

    def warn(self, text: str) -> None:
        """A message that stays longer and is remembered (tests and the user can read it back)."""
        self.last_warning = text
        self._warning_until = time.monotonic() + _MESSAGE_MS / 1000
        self.bar.showMessage(f"⚠ {text}", _WARNING_MS)

    def retract(self, text: str) -> None:
        """Take back warning `text` (no longer true) if it is the one showing."""
        if self.last_warning != text:
            return
        self.last_warning = None
        self._warning_until = 0.0
        if self.bar.currentMessage() == f"⚠ {text}":
            self.bar.clearMessage()

    def show_hover(self, text: str) -> None:
        if text:
            self.bar.showMessage(text)
        else:
            self.bar.clearMessage()

    def set_busy(self, text: str) -> None:
        self.busyLabel.setText(text)

    def set_timing(self, name: str, ms: float | None) -> None:
        """Keep the latest prefill / recompress / regenerate time in the permanent label."""
        if ms is None:
            self._timings.pop(name, None)
        else:
            self._timings[name] = float(ms)
        self.timingLabel.setText(" · ".join(f"{k} {v:,.0f} ms" for k, v in self._timings.items()))
