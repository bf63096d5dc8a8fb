"""Heatmap update at 36 layers x 8 kv-heads x 32,768 positions: binned to screen pixels vs every cell.

Each update is set_data (a new kept mask, as a slider move gives) plus the ImageItem building its QImage.
"binned" is the widget (one image column per screen pixel, kept fraction per bin); "every cell" pushes the
full-resolution RGBA the widget drew before binning. Median of REPEATS, measured side by side in one run.
Run: QT_QPA_PLATFORM=offscreen .venv/bin/python -m benchmarks.heatmap_long
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

LAYERS, HEADS, T, REPEATS = 36, 8, 32_768, 15


def _median_ms(fn) -> float:  # noqa: ANN001
    times = []
    for i in range(REPEATS):
        start = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    import pyqtgraph as pg
    from PySide6.QtWidgets import QApplication

    from app.widgets.heatmap import VIEW_KEPT, VIEW_SCORES, RetentionHeatmap, render_kept

    app = QApplication.instance() or QApplication([])
    rng = np.random.default_rng(0)
    rows = LAYERS * HEADS
    kepts = [rng.random((rows, T)) < r for r in np.linspace(0.1, 0.9, REPEATS)]
    scores = rng.random((rows, T), dtype=np.float32)
    labels = [f"L{layer} H{h}" for layer in range(LAYERS) for h in range(HEADS)]
    tokens = [str(i) for i in range(T)]
    widget = RetentionHeatmap()
    widget.resize(1600, 900)
    widget.show()
    app.processEvents()

    def binned(i: int) -> None:
        widget.set_data(kepts[i], labels, tokens, scores, None, LAYERS, HEADS)
        widget.image.render()

    full_item = pg.ImageItem(axisOrder="row-major")

    def every_cell(i: int) -> None:
        full_item.setImage(render_kept(kepts[i]), autoLevels=False, levels=(0, 255))
        full_item.render()

    binned(0)
    every_cell(0)
    kept_ms, full_ms = _median_ms(binned), _median_ms(every_cell)
    widget.set_view(VIEW_SCORES)
    scores_ms = _median_ms(binned)
    widget.set_view(VIEW_KEPT)
    widget.plot.setXRange(16_000, 16_400, padding=0)
    zoomed_ms = _median_ms(binned)
    first, end, width = widget.displayed_window()
    widget.plot.setXRange(0, T, padding=0)
    _, _, full_width = widget.displayed_window()
    print(f"heatmap update, {LAYERS}x{HEADS} rows x {T:,} positions, median of {REPEATS}:")
    print(f"  binned, Kept view ({full_width} positions per image column): {kept_ms:8.1f} ms")
    print(f"  binned, Scores view                              : {scores_ms:8.1f} ms")
    print(f"  zoomed to {end - first} columns (exact cells, width {width})      : {zoomed_ms:8.1f} ms")
    print(
        f"  every cell (full-resolution image)               : {full_ms:8.1f} ms  ({full_ms / kept_ms:.1f}x slower)"
    )
    widget.close()


if __name__ == "__main__":
    main()
