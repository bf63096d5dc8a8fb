"""Bad input never crashes or freezes the window, and the session the user had stays intact; settings persist."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QMessageBox

from app.settings import Settings
from app.window.main_window import MainWindow
from tests.app.waiting import wait_until
from tests.model_factory import build_model

PROMPT = "def area(width, height):\n    return width * height\n\nclass Box:\n    pass\n"


def _open(model: str | None, settings_path) -> MainWindow:
    window = MainWindow(model=model, settings_path=settings_path, continuation_tokens=4)
    window.show()
    if model:
        wait_until(lambda: window.model_info is not None)
    return window


def _close(window: MainWindow) -> None:
    window.close()
    QApplication.processEvents()


@pytest.fixture(scope="module")
def prefilled(qapp, model_dirs, tmp_path_factory):
    """A window on the llama test model with a prompt prefilled and compressed."""
    window = _open(str(model_dirs["llama"]), tmp_path_factory.mktemp("s") / "settings.json")
    window.prefill(PROMPT)
    wait_until(lambda: window.displayed_ids)
    yield window
    _close(window)


def _expect_error(window: MainWindow, action, *fragments: str) -> None:
    window.last_error = None
    action()
    wait_until(lambda: window.last_error is not None)
    for fragment in fragments:
        assert fragment in window.last_error


def _session_still_works(window: MainWindow, name: str) -> None:
    assert window.model_info.name == name
    image = window.heatmap.image_rgba()
    slider = window.controls.retentionSlider
    slider.setValue(90 if slider.value() != 90 else 80)
    rid = window.engine.latest_id("compress")
    wait_until(lambda: window.displayed_ids[-1] == rid)
    assert not np.array_equal(image, window.heatmap.image_rgba())


def test_a_folder_that_is_not_a_model_keeps_the_session(prefilled, tmp_path):
    name = prefilled.model_info.name
    _expect_error(prefilled, lambda: prefilled.load_model(str(tmp_path)), "not a model folder")
    box = prefilled.findChild(QMessageBox, "errorBox")
    assert box is not None and box.isVisible() and "not a model folder" in box.text()
    _session_still_works(prefilled, name)


def test_an_unsupported_architecture_keeps_the_session(prefilled, tmp_path):
    folder = build_model(tmp_path / "gemma2", "gemma2")
    name = prefilled.model_info.name
    _expect_error(prefilled, lambda: prefilled.load_model(str(folder)), "scaled_dot_product_attention")
    _session_still_works(prefilled, name)


def test_empty_and_too_long_prompts_are_refused_with_a_message(prefilled):
    name = prefilled.model_info.name
    submitted = prefilled.engine.latest_id("prefill")
    _expect_error(prefilled, lambda: prefilled.prefill("   \n"), "Type a prompt")
    assert prefilled.engine.latest_id("prefill") == submitted
    _expect_error(prefilled, lambda: prefilled.prefill("x = 1\n" * 3000), "context")
    _session_still_works(prefilled, name)


def test_export_to_a_missing_folder_says_so_and_writes_nothing(prefilled, tmp_path):
    target = tmp_path / "missing" / "stats.csv"
    assert not prefilled.export_csv(target)
    assert str(target) in prefilled.last_error and not target.exists()
    assert not prefilled.export_image(tmp_path / "missing" / "heatmap.png")
    assert not prefilled.export_image(tmp_path / "heatmap.bmp")
    assert ".png or .svg" in prefilled.last_error


def test_settings_persist_and_a_corrupt_file_falls_back_with_a_warning(qapp, model_dirs, tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{not json", encoding="utf-8")
    model = str(model_dirs["llama"])
    window = _open(model, path)
    assert "corrupt" in (window.status.last_warning or "")
    assert window.controls.config()["ratio"] == 0.25
    window.sessionPanel.promptEdit.setPlainText(PROMPT)
    window.controls.set_config({"method": "h2o", "ratio": 0.4, "bits": 4, "group_size": 32})
    _close(window)

    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["last_method"] == "h2o" and saved["last_bits"] == 4 and saved["recent_models"] == [model]
    window = _open(None, path)
    try:
        cfg = window.controls.config()
        assert (cfg["method"], cfg["ratio"], cfg["bits"], cfg["group_size"]) == ("h2o", 0.4, 4, 32)
        assert window.sessionPanel.promptEdit.toPlainText() == PROMPT
        assert window.status.last_warning is None
        assert Settings.load(path)[0].recent_models == [model]
    finally:
        _close(window)


def test_shortcuts_leave_the_prompt_editor_its_arrow_keys(prefilled):
    for box in prefilled.findChildren(QMessageBox):
        box.close()  # a window-modal message rightly blocks the window's shortcuts
    edit = prefilled.sessionPanel.promptEdit
    edit.setPlainText("")
    prefilled.activateWindow()
    assert QTest.qWaitForWindowActive(prefilled)
    edit.setFocus()
    extends = prefilled.engine.latest_id("extend")
    QTest.keyClick(edit, Qt.Key.Key_Right)
    assert prefilled.engine.latest_id("extend") == extends
    prefilled.last_error = None
    # Prefill is Ctrl+Return (Cmd+Return on a Mac), also while the editor has focus.
    QTest.keyClick(edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert "Type a prompt" in (prefilled.last_error or "")
    edit.setPlainText(PROMPT)


@pytest.mark.parametrize(
    "field, value",
    [
        ("geometry", "é"),
        ("geometry", "not base64!"),
        ("last_bits", 7),
        ("last_group_size", 48),
        ("last_ratio", float("inf")),
        ("last_schedule", "later"),
        ("recent_models", ["", 3]),
    ],
)
def test_a_bad_settings_field_never_stops_the_window(qapp, tmp_path, field, value):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({field: value, "last_prompt": PROMPT}), encoding="utf-8")
    window = _open(None, path)
    try:
        assert field in (window.status.last_warning or "")
        assert window.sessionPanel.promptEdit.toPlainText() == PROMPT
        assert getattr(window.settings, field) == getattr(Settings(), field)
    finally:
        _close(window)


def test_a_calibrated_method_without_its_artifact_names_the_command(prefilled, tmp_path, monkeypatch):
    from kvcore.defaults import DATA_DIR_ENV

    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    name = prefilled.model_info.name
    combo = prefilled.controls.methodCombo
    _expect_error(prefilled, lambda: combo.setCurrentText("qfilter"), "kvlens calibrate qfilter --model")
    assert "\n" not in prefilled.last_error
    combo.setCurrentText("snapkv")
    _session_still_works(prefilled, name)
