"""An x axis with one column per token: token text under each column when it fits, positions otherwise.

Shared by the heatmap (prompt positions) and the per-token strip (generated tokens), so both read alike.
"""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtGui import QFontMetrics


def token_label(text: str, limit: int = 12) -> str:
    """A token as one short visible line (newlines and tabs escaped)."""
    shown = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


class TokenAxis(pg.AxisItem):
    """Bottom axis: token text under each column when it fits, otherwise positions."""

    def __init__(self) -> None:
        super().__init__("bottom")
        self.enableAutoSIPrefix(False)  # columns are positions: never "position (x0.001)"
        self.tokens: list[str] = []
        self._text_mode = False

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list:  # noqa: N802 (Qt name)
        self._text_mode = False
        if maxVal <= minVal or size <= 0:
            return []
        px_per_col = size / (maxVal - minVal)
        lo, hi = max(0, math.floor(minVal)), min(len(self.tokens), math.ceil(maxVal))
        if self.tokens and px_per_col >= 12 and hi > lo:
            fm = QFontMetrics(self.style.get("tickFont") or self.font())
            widest = max(fm.horizontalAdvance(token_label(t)) for t in self.tokens[lo:hi])
            if px_per_col >= widest + 6:
                self._text_mode = True
                return [(1.0, [i + 0.5 for i in range(lo, hi)])]
        levels = [
            (spacing, [v + 0.5 for v in values])
            for spacing, values in super().tickValues(minVal, maxVal, size)
            if spacing >= 1
        ]
        return levels or [(1.0, [i + 0.5 for i in range(max(0, math.floor(minVal)), math.ceil(maxVal))])]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:  # noqa: N802
        cols = [int(math.floor(v)) for v in values]
        if self._text_mode:
            return [token_label(self.tokens[c]) if 0 <= c < len(self.tokens) else "" for c in cols]
        return [str(c) for c in cols]
