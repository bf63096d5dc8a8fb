"""A scheme's parameters and the edge-layer widths chosen in the controls reach the session (issue 39): the state
the window draws uses the spec, its statistics give each layer's widths, and a saved session keeps both."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.window.main_window import MainWindow
from tests.app.waiting import wait_until
from tests.app.windows import shown_after

PROMPT = "def main(argv): return sum(x * x for x in argv) The quick brown fox jumps over the lazy dog."


def test_rotated_mxfp4_and_edge_layers_reach_the_state_and_a_saved_session(qapp, model_dirs, tmp_path):
    window = MainWindow(
        model=str(model_dirs["llama"]), settings_path=tmp_path / "s.json", continuation_tokens=2
    )
    window.show()
    try:
        wait_until(lambda: window.model_info is not None)
        window.controls.set_config({"bits": 4, "method": "snapkv", "ratio": 0.5})
        window.prefill(PROMPT)
        wait_until(lambda: window.displayed_ids)
        controls = window.controls
        shown_after(
            window, lambda: controls.quantCombo.setCurrentIndex(controls.quantCombo.findData("rotated"))
        )
        shown_after(window, lambda: controls.quantParameters.spin("packing").setCurrentText("mxfp4"))
        assert window.last_error is None
        rows = window.statsTable.rows()
        assert {r["quant_scheme"] for r in rows} == {"rotated:packing=mxfp4"}
        assert {r["execution"] for r in rows} == {"genuine"}

        controls.quantParameters.spin("packing").setCurrentText("affine")
        controls.edgeBitsSpin.setValue(8)  # mxfp4 had kept it at its only width, 4
        shown_after(window, lambda: controls.edgeLayersSpin.setValue(1))
        assert window.last_error is None
        widths = {int(r["layer"]): r["bits_per_layer"] for r in window.statsTable.rows()}
        assert widths == {0: "8/8", 1: "4/4", 2: "4/4", 3: "8/8"}

        path = tmp_path / "s.kvlens"
        window.session_files.save(path)
        wait_until(lambda: window.session_files.last_saved is not None)
        saved = controls.config()
        controls.set_config({"quant": "affine"})
        window.session_files.open(path)
        wait_until(lambda: window.session_files.last_opened == str(path))
        assert controls.config() == saved and (saved["edge_layers"], saved["quant"]) == (1, "rotated")
    finally:
        window.close()
        QApplication.processEvents()
