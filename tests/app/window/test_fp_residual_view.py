"""A float residual covering everything kept (issue 42 item 11): the window shows what the controls say, no error."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.window.main_window import MainWindow
from tests.app.waiting import wait_until
from tests.app.windows import shown_after

PROMPT = "def main(argv): return sum(x * x for x in argv) The quick brown fox jumps over the lazy dog."


def test_a_residual_longer_than_the_prompt_is_drawn_as_the_controls_say(qapp, model_dirs, tmp_path):
    window = MainWindow(
        model=str(model_dirs["llama"]), settings_path=tmp_path / "s.json", continuation_tokens=2
    )
    window.show()
    try:
        wait_until(lambda: window.model_info is not None)
        assert window.model_info.cache_dtype == "float32"  # MLX's CPU backend upcasts half precision
        window.controls.set_config({"bits": None})
        assert window.controls.bitsLabel.text() == "off (float32)"
        window.prefill(PROMPT)
        wait_until(lambda: window.displayed_ids)
        config = {"method": "full", "ratio": 1.0, "bits": 4, "group_size": 32, "fp_recent": 1200}
        shown_after(window, lambda: window.controls.set_config(config))
        assert window.last_error is None
        rows = window.statsTable.rows()
        assert window.controls.config()["fp_recent"] == 1200
        assert {int(r["fp_recent"]) for r in rows} == {1200}
        assert {float(r["key_rmse"]) for r in rows} == {0.0}  # every kept row is in the float residual
    finally:
        window.close()
        QApplication.processEvents()
