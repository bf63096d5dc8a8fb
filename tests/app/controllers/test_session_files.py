"""Save Session → close → Open Session on a fresh window: the same heatmap, statistics, metrics, continuations
and pin, with no forward pass; a session of another model loads that model; bad files change nothing."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QApplication

from app.window.main_window import MainWindow
from kvcore.cache import files as cache_io
from kvcore.engine.session_file import FORMAT, VERSION
from tests.app.waiting import wait_until

PROMPT = "def area(width, height):\n    return width * height\n\nclass Box:\n    pass\n" * 2


def _window(model: str, settings) -> MainWindow:
    window = MainWindow(model=model, settings_path=settings, continuation_tokens=5)
    window.show()
    wait_until(lambda: window.model_info is not None)
    return window


def _close(window: MainWindow) -> None:
    window.close()
    QApplication.processEvents()


def _screen(window: MainWindow) -> dict:
    """Everything the user sees of a compression result."""
    return {
        "heatmap": window.heatmap.image_rgba().copy(),
        "pinned": None if window.heatmap.pinned() is None else window.heatmap.pinned().copy(),
        "rows": window.statsTable.rows(),
        "columns": window.statsTable.columns(),
        "metrics": window.metricsPanel.text(),
        "dense": window.comparison.denseTextView.toPlainText(),
        "compressed": window.comparison.compressedTextView.toPlainText(),
        "config": window.controls.config(),
        "prompt": window.sessionPanel.promptEdit.toPlainText(),
        "view": window.heatmap.view(),
        "chat": (
            window.sessionPanel.chatTemplateCheck.isChecked(),
            window.sessionPanel.systemPromptEdit.text(),
        ),
    }


def _engine_session(window: MainWindow):
    return window.engine._state["session"]


def _assert_same_screen(a: dict, b: dict) -> None:
    np.testing.assert_array_equal(a["heatmap"], b["heatmap"])
    if a["pinned"] is None:
        assert b["pinned"] is None
    else:
        np.testing.assert_array_equal(a["pinned"], b["pinned"])
    assert json.dumps(a["rows"], sort_keys=True) == json.dumps(b["rows"], sort_keys=True)
    assert {
        k: a[k] for k in ("columns", "metrics", "dense", "compressed", "config", "prompt", "view", "chat")
    } == {k: b[k] for k in ("columns", "metrics", "dense", "compressed", "config", "prompt", "view", "chat")}


@pytest.fixture(scope="module")
def saved(qapp, model_dirs, tmp_path_factory):
    """(screen of the window that saved, session file path) — that window is closed (the user quit)."""
    root = tmp_path_factory.mktemp("sessions")
    window = _window(str(model_dirs["llama"]), root / "settings.json")
    window.sessionPanel.promptEdit.setPlainText(PROMPT)
    window.sessionPanel.chatTemplateCheck.setChecked(False)
    window.prefill()
    wait_until(lambda: window.displayed_ids)
    window.controls.set_config({"method": "h2o", "ratio": 0.4, "bits": 4, "group_size": 32})
    rid = window.engine.latest_id("compress")
    wait_until(lambda: window.displayed_ids[-1] == rid)
    assert window.pinning.pin()
    window.controls.set_config({"method": "snapkv", "ratio": 0.25})
    rid = window.engine.latest_id("compress")
    wait_until(lambda: window.displayed_ids[-1] == rid)
    screen = _screen(window)
    assert screen["pinned"] is not None and "jaccard_vs_pinned" in screen["columns"]
    path = root / "work.kvlens"
    window.session_files.save(root / "work")  # the suffix is added
    wait_until(lambda: window.session_files.last_saved is not None)
    assert window.session_files.last_saved == str(path) and path.is_file()
    assert [a.text() for a in window.actions_.recent_sessions.actions()] == [str(path.resolve())]
    _close(window)
    return screen, path


def test_open_on_a_fresh_window_shows_the_same_view_with_no_forward_pass(saved, model_dirs, tmp_path):
    screen, path = saved
    window = _window(str(model_dirs["llama"]), tmp_path / "settings.json")
    try:
        assert window.actions_.open_session.shortcut() == QKeySequence("Ctrl+O")
        assert window.actions_.save_session.shortcut() == QKeySequence("Ctrl+S")
        window.session_files.open(path)
        wait_until(lambda: window.session_files.last_opened == str(path))
        QApplication.processEvents()
        _assert_same_screen(screen, _screen(window))
        assert _engine_session(window).forward_calls == 0
        assert window.settings.recent_sessions == [str(path.resolve())]
        window.controls.set_config({"ratio": 0.5, "method": "tova"})  # and it goes on from there
        rid = window.engine.latest_id("compress")
        wait_until(lambda: window.displayed_ids and window.displayed_ids[-1] == rid)
        assert window.statsTable.rows()[0]["method"] == "tova" and window.last_error is None
    finally:
        _close(window)


def test_a_session_of_another_model_loads_that_model(saved, model_dirs, tmp_path):
    screen, path = saved
    window = _window(str(model_dirs["qwen3"]), tmp_path / "settings.json")
    try:
        before = window.model_info.name
        window.session_files.open(path)
        wait_until(lambda: window.session_files.last_opened == str(path))
        assert window.model_info.name != before
        _assert_same_screen(screen, _screen(window))
        assert _engine_session(window).forward_calls == 0
    finally:
        _close(window)


def _forge(path, out, edit):
    header, arrays = cache_io.read_file(path, FORMAT, VERSION)
    arrays = dict(arrays)
    edit(header, arrays)
    header["sha256"] = cache_io._digest(header, arrays)
    with open(out, "wb") as fh:
        mx.save_safetensors(fh, arrays, {"kvlens": json.dumps(header, sort_keys=True)})


BAD = {
    "truncated": (lambda raw, out: out.write_bytes(raw[: len(raw) // 2]), "truncated"),
    "flipped byte": (lambda raw, out: out.write_bytes(raw[:-3] + bytes([raw[-3] ^ 1]) + raw[-2:]), "SHA-256"),
    "view mask cut": (
        lambda h, a: a.update({"extra.view.kept": a["extra.view.kept"][:, :3]}),
        "view: kept must be",
    ),
    "prompt ids": (lambda h, a: h.__setitem__("prompt_ids", [-1, 2]), "prompt_ids"),
    "pin mask": (lambda h, a: a.update({"extra.pin.kept": a["extra.pin.kept"][0]}), "pin:"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_session_files_change_nothing_and_say_why(saved, model_dirs, tmp_path, case):
    _, path = saved
    window = _window(str(model_dirs["llama"]), tmp_path / "settings.json")
    try:
        window.sessionPanel.promptEdit.setPlainText("x = 1\ny = 2\n")
        window.prefill()
        wait_until(lambda: window.displayed_ids)
        before, session = _screen(window), _engine_session(window)
        out = tmp_path / "bad.kvlens"
        make, fragment = BAD[case]
        if case in ("truncated", "flipped byte"):
            make(path.read_bytes(), out)
        else:
            _forge(path, out, make)
        window.last_error = None
        window.session_files.open(out)
        wait_until(lambda: window.last_error is not None)
        assert str(out) in window.last_error and fragment in window.last_error
        assert window._message_box is not None and window._message_box.text() == window.last_error
        assert _engine_session(window) is session
        _assert_same_screen(before, _screen(window))
    finally:
        _close(window)


def test_nothing_to_save_and_bad_paths_are_explained(qapp, model_dirs, tmp_path):
    window = _window(str(model_dirs["llama"]), tmp_path / "settings.json")
    try:
        assert window.session_files.save(tmp_path / "s.kvlens") is None
        assert "Prefill a prompt first" in window.last_error
        window.prefill(PROMPT)
        wait_until(lambda: window.displayed_ids)
        assert window.session_files.save(tmp_path / "missing" / "s.kvlens") is None
        assert "existing folder" in window.last_error
        assert list(tmp_path.glob("*.kvlens")) == []
    finally:
        _close(window)
