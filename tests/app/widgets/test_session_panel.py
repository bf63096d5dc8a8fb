"""SessionPanel: model list order, request signals, busy state, token hover."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QFileDialog

from app.widgets.session_panel import OPEN_FOLDER, SessionPanel, find_cached_models


def _fake_cache(root):
    good = root / "models--org--tiny" / "snapshots" / "abc"
    good.mkdir(parents=True)
    (good / "config.json").write_text("{}")
    (good / "model.safetensors").write_bytes(b"")
    no_weights = root / "models--org--noweights" / "snapshots" / "def"
    no_weights.mkdir(parents=True)
    (no_weights / "config.json").write_text("{}")
    (root / "datasets--x--y").mkdir()
    return good


@pytest.fixture
def panel(qtbot, tmp_path):
    cache = tmp_path / "hub"
    _fake_cache(cache)
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "b_code.txt").write_text("def f(x):\n")
    (prompts / "a_story.txt").write_text("Once upon a time")
    (prompts / "notes.json").write_text('{"b_code.txt": "What to look for in b."}')
    widget = SessionPanel(
        demo_model="/res/models/demo",
        recent_models=["/m/recent1", "/m/recent2"],
        prompts_dir=prompts,
        hf_cache=cache,
    )
    qtbot.addWidget(widget)
    widget.resize(500, 600)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def test_find_cached_models(tmp_path, monkeypatch):
    good = _fake_cache(tmp_path)
    assert find_cached_models(tmp_path) == [("org/tiny", good)]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert find_cached_models() == [("org/tiny", good)]
    assert find_cached_models(tmp_path / "missing") == []


def test_model_entries_order(panel, tmp_path):
    entries = panel.model_entries()
    assert [kind for _, _, kind in entries] == ["demo", "recent", "recent", "cache", "open"]
    assert entries[0][1] == "/res/models/demo"
    assert entries[3][0] == "org/tiny (HF cache)"
    assert entries[-1][0] == OPEN_FOLDER
    assert panel.modelCombo.isEditable()


def test_load_requests(panel, qtbot):
    with qtbot.waitSignal(panel.loadRequested) as blocker:
        qtbot.mouseClick(panel.loadButton, Qt.MouseButton.LeftButton)
    assert blocker.args == ["/res/models/demo"]
    panel.modelCombo.setEditText("/typed/path")
    with qtbot.waitSignal(panel.loadRequested) as blocker:
        panel.loadButton.click()
    assert blocker.args == ["/typed/path"]


def test_open_folder_entry_uses_dialog(panel, qtbot, monkeypatch, tmp_path):
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path))
    with qtbot.waitSignal(panel.loadRequested) as blocker:
        panel.modelCombo.activated.emit(panel.modelCombo.count() - 1)
    assert blocker.args == [str(tmp_path)]
    assert panel.modelCombo.currentText() == str(tmp_path)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: "")
    with qtbot.assertNotEmitted(panel.loadRequested):
        panel.modelCombo.activated.emit(panel.modelCombo.count() - 1)


def test_sample_prompts_and_run_signals(panel, qtbot):
    combo = panel.samplePromptCombo
    assert [combo.itemText(i) for i in range(combo.count())] == ["Sample prompts…", "a story", "b code"]
    assert combo.itemData(2, Qt.ItemDataRole.ToolTipRole) == "What to look for in b."
    assert combo.itemData(1, Qt.ItemDataRole.ToolTipRole) is None
    combo.activated.emit(2)
    assert panel.promptEdit.toPlainText() == "def f(x):\n"
    assert not panel.prefillButton.isEnabled() and not panel.stepButton.isEnabled()
    panel.set_model_loaded("demo")
    assert panel.prefillButton.isEnabled() and not panel.generateButton.isEnabled()
    with qtbot.waitSignal(panel.prefillRequested) as blocker:
        panel.prefillButton.click()
    assert blocker.args == ["def f(x):\n"]
    panel.set_generated(["def", " f", "(x"], prompt_len=3)
    panel.generateCountSpin.setValue(7)
    with qtbot.waitSignal(panel.generateRequested) as blocker:
        panel.generateButton.click()
    assert blocker.args == [7]
    with qtbot.waitSignal(panel.stepRequested):
        panel.stepButton.click()


def test_busy_state_and_cancel(panel, qtbot):
    panel.set_model_loaded("demo")
    panel.set_busy(True, "Prefilling…")
    assert panel.busyIndicator.isVisible() and panel.cancelButton.isVisible()
    assert panel.busyLabel.text() == "Prefilling…"
    assert not panel.prefillButton.isEnabled() and not panel.loadButton.isEnabled()
    with qtbot.waitSignal(panel.cancelRequested):
        panel.cancelButton.click()
    panel.set_busy(False)
    assert not panel.busyIndicator.isVisible() and panel.prefillButton.isEnabled()


def test_hovering_a_token_emits_its_position(panel, qtbot):
    tokens = ["Once", " upon", " a", " time", ",", " there"]
    panel.set_generated(tokens, prompt_len=4)
    view = panel.generatedView
    assert view.toPlainText() == "".join(tokens)
    start, end = panel.token_span(1)
    cursor = view.textCursor()
    cursor.setPosition(start + 2)
    point = view.cursorRect(cursor).center()
    with qtbot.waitSignal(panel.tokenHovered) as blocker:
        QTest.mouseMove(view.viewport(), point)
    assert blocker.args == [1]
    assert len(view.extraSelections()) == 1
    cursor.setPosition(panel.token_span(5)[0] + 2)
    with qtbot.waitSignal(panel.tokenHovered) as blocker:
        QTest.mouseMove(view.viewport(), view.cursorRect(cursor).center())
    assert blocker.args == [5]
