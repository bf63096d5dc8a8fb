"""Refusals in the window: a dialog with one line naming the problem and the fix, before any prefill."""

from __future__ import annotations

import json
import shutil

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QMessageBox

from app.widgets.controls import BITS_STEPS
from app.window.main_window import MainWindow
from tests.app.waiting import wait_until
from tests.model_factory import build_model

PROMPT = "def area(width, height):\n    return width * height\n"


def _dialog(window: MainWindow) -> QMessageBox:
    wait_until(lambda: window.findChild(QMessageBox, "errorBox") is not None)
    return window.findChild(QMessageBox, "errorBox")


@pytest.mark.parametrize(
    "arch, why", [("gpt_oss", "attention sinks"), ("deepseek_v3", "multi-head latent attention")]
)
def test_quantized_kv_the_model_cannot_run_is_a_dialog_before_prefill(qapp, tmp_path, arch, why):
    folder = build_model(tmp_path / arch, arch)
    window = MainWindow(model=str(folder), settings_path=tmp_path / "s.json", continuation_tokens=2)
    window.show()
    try:
        wait_until(lambda: window.model_info is not None)
        if arch == "deepseek_v3":  # the load line says what the cache holds
            assert (
                "4 query heads sharing one latent kv-head of 32 + 16 RoPE"
                in window.statusBar().currentMessage()
            )
        window.controls.bitsSlider.setValue(BITS_STEPS.index(4))
        window.sessionPanel.promptEdit.setPlainText(PROMPT)
        wait_until(
            window.sessionPanel.prefillButton.isEnabled
        )  # the load job has finished, not just reported
        QTest.mouseClick(window.sessionPanel.prefillButton, Qt.MouseButton.LeftButton)
        text = _dialog(window).text()
        assert why in text and "choose 16 bits" in text and "\n" not in text
        assert window.engine.latest_id("prefill") is None and not window.displayed_ids
    finally:
        window.close()
        QApplication.processEvents()


def test_config_without_model_type_is_a_load_dialog(qapp, model_dirs, tmp_path):
    folder = tmp_path / "no-type"
    shutil.copytree(model_dirs["llama"], folder)
    config = json.loads((folder / "config.json").read_text())
    del config["model_type"]
    (folder / "config.json").write_text(json.dumps(config))
    window = MainWindow(model=None, settings_path=tmp_path / "s.json", continuation_tokens=2)
    window.show()
    try:
        window.load_model(str(folder))
        box = _dialog(window)
        assert box.windowTitle() == "Could not load the model"
        assert f"{folder / 'config.json'} has no 'model_type'" in box.text() and window.model_info is None
    finally:
        window.close()
        QApplication.processEvents()
