"""A gemma3_text window: the sliding-window layers are labelled in the heatmap and apart in the metrics."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.window.main_window import MainWindow
from tests.app.waiting import wait_until
from tests.model_factory import ARCHS, build_model

PROMPT = "def main(argv): return sum(x * x for x in argv) The quick brown fox jumps over the lazy dog."


def test_sliding_window_layers_are_labelled_and_counted_apart(qapp, tmp_path):
    folder = build_model(tmp_path / "gemma3_text", "gemma3_text")
    window = MainWindow(model=str(folder), settings_path=tmp_path / "s.json", continuation_tokens=2)
    window.show()
    try:
        wait_until(lambda: window.model_info is not None)
        window.prefill(PROMPT)
        wait_until(lambda: window.displayed_ids)
        size = ARCHS["gemma3_text"]["sliding_window"]
        assert window.heatmap.fixed_labels() == [f"sliding window {size}: not compressible"] * 2
        rows = window.statsTable.rows()
        assert {r["layer"] for r in rows if not r["compressible"]} == {0, 1}
        ratio = {
            k: float(window.metricsPanel.value_text(k).rstrip("×"))
            for k in ("compression_ratio", "compressible_ratio")
        }
        assert ratio["compressible_ratio"] < ratio["compression_ratio"] < 1
    finally:
        window.close()
        QApplication.processEvents()
