"""The left axis of a map whose rows are (layer, kv-head): every row's label when rows are tall enough, otherwise
one label per layer. Shared by the retention heatmap and the ThinK channel map, so both read alike."""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtGui import QFontMetrics


class RowAxis(pg.AxisItem):
    """Left axis: every row label when rows are tall enough, otherwise one label per layer."""

    def __init__(self) -> None:
        super().__init__("left")
        self.enableAutoSIPrefix(False)
        self.labels: list[str] = []
        self.heads = 1
        self.layer_offset = 0
        self._all_rows = True

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list:  # noqa: N802
        n = len(self.labels)
        minVal, maxVal = sorted((minVal, maxVal))  # noqa: N806 (the y axis is inverted: range comes high-low)
        if not n or maxVal <= minVal or size <= 0:
            return []
        lo, hi = max(0, math.floor(minVal)), min(n, math.ceil(maxVal))
        px_per_row = size / (maxVal - minVal)
        need = QFontMetrics(self.style.get("tickFont") or self.font()).height() + 2
        self._all_rows = px_per_row >= need
        if self._all_rows:
            return [(1.0, [i + 0.5 for i in range(lo, hi)])]
        step = max(1, math.ceil(need / (px_per_row * self.heads)))
        first = (lo // (self.heads * step)) * self.heads * step
        return [(float(self.heads * step), [i + 0.5 for i in range(first, hi, self.heads * step) if i >= lo])]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:  # noqa: N802
        rows = [int(math.floor(v)) for v in values]
        if self._all_rows:
            return [self.labels[r] if 0 <= r < len(self.labels) else "" for r in rows]
        return [f"L{self.layer_offset + r // self.heads}" for r in rows]
