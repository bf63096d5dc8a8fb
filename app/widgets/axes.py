"""Plot axes that show values as they are: no SI-prefix scaling ("KL (x0.001)" is easy to misread and its
label is the first thing a narrow plot clips), and small or large numbers in scientific notation."""

from __future__ import annotations

import math

import pyqtgraph as pg


def tick_text(value: float, spacing: float) -> str:
    """`value` with enough significant digits to tell ticks `spacing` apart; 1e-05 rather than 0.00001."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    digits = 3
    if spacing > 0:
        digits = max(digits, math.ceil(math.log10(abs(value) / spacing)) + 1)
    text = f"{value:.{min(digits, 12)}g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


class ScientificAxis(pg.AxisItem):
    """An axis without SI-prefix scaling whose linear ticks read like 0.25, 2e-5 or 1.2e6 (log axes: pyqtgraph's)."""

    def __init__(self, orientation: str, **kwargs) -> None:  # noqa: ANN003 (pg.AxisItem's options)
        super().__init__(orientation, **kwargs)
        self.enableAutoSIPrefix(False)

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:  # noqa: N802 (Qt name)
        if self.logMode:
            return super().tickStrings(values, scale, spacing)
        return [tick_text(v * scale, spacing * scale) for v in values]
