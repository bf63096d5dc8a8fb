"""Time to push a 32 layers x 8 kv-heads x 8192 positions retention image into the heatmap.

Prints the median of 20 pushes for the widget's LUT path and for a naive float path
(colormap on a float image, autoLevels=True), each including pyqtgraph building its QImage.
Run: QT_QPA_PLATFORM=offscreen .venv/bin/python -m benchmarks.heatmap_refresh
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

LAYERS, HEADS, T, REPEATS = 32, 8, 8192, 20


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

    from app.widgets.heatmap import RetentionHeatmap

    app = QApplication.instance() or QApplication([])
    rng = np.random.default_rng(0)
    rows = LAYERS * HEADS
    kepts = [rng.random((rows, T)) < r for r in np.linspace(0.1, 0.9, REPEATS)]
    scores = rng.random((rows, T), dtype=np.float32)
    labels = [f"L{layer} H{h}" for layer in range(LAYERS) for h in range(HEADS)]
    tokens = [str(i) for i in range(T)]
    widget = RetentionHeatmap()
    widget.resize(1200, 800)
    widget.show()
    app.processEvents()

    def lut_push(i: int) -> None:
        widget.set_data(kepts[i], labels, tokens, scores, None, LAYERS, HEADS)
        widget.image.render()

    cmap = pg.colormap.get("viridis")
    naive_item = pg.ImageItem(axisOrder="row-major")

    def naive_push(i: int) -> None:
        rgba = cmap.map(kepts[i].astype(np.float32), mode="float")
        naive_item.setImage(rgba.reshape(rows, T, 4), autoLevels=True)
        naive_item.render()

    lut_push(0)
    naive_push(0)
    lut_ms, naive_ms = _median_ms(lut_push), _median_ms(naive_push)
    print(f"heatmap refresh, {LAYERS}x{HEADS} rows x {T} positions, median of {REPEATS}:")
    print(f"  packed-uint32 LUT, autoLevels=False : {lut_ms:8.1f} ms")
    print(f"  naive float colormap, autoLevels   : {naive_ms:8.1f} ms  ({naive_ms / lut_ms:.1f}x slower)")
    widget.close()


if __name__ == "__main__":
    main()
