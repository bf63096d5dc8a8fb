"""The Session panel's Chat template box and system prompt, in a real window on a model whose tokenizer has one."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.settings import Settings
from app.widgets.session_panel import SessionPanel
from app.window.main_window import MainWindow
from tests.app.waiting import wait_until
from tests.model_factory import with_chat_template

PROMPT = "def main(argv): return sum(x * x for x in argv)"
SYSTEM = "The quick brown fox."
TOKENS = 2


def test_box_follows_the_tokenizer_and_blank_system_prompt_is_none(qtbot):
    panel = SessionPanel()
    qtbot.addWidget(panel)
    assert panel.chat_template() == (True, None)
    panel.systemPromptEdit.setText(SYSTEM)
    assert panel.chat_template() == (True, SYSTEM)
    panel.set_chat_template_available(False)
    assert not panel.chatTemplateCheck.isEnabled() and not panel.systemPromptEdit.isEnabled()
    assert panel.chat_template() == (False, None) and "no chat template" in panel.chatTemplateCheck.toolTip()
    panel.set_chat_template_available(True)
    panel.chatTemplateCheck.setChecked(False)
    assert not panel.systemPromptEdit.isEnabled() and panel.chat_template() == (False, None)


@pytest.fixture
def chat_window(qapp, model_dirs, tmp_path):
    folder = with_chat_template(model_dirs["llama"], tmp_path / "llama-chat")
    settings = tmp_path / "settings.json"
    window = MainWindow(model=str(folder), settings_path=settings, continuation_tokens=TOKENS)
    window.show()
    wait_until(lambda: window.model_info is not None)
    yield window, settings
    window.close()
    QApplication.processEvents()


def _prefill_and_read(window: MainWindow) -> str:
    """Click Prefill and return the token view's text once the new sequence is shown."""
    view = window.sessionPanel.generatedView
    wait_until(window.sessionPanel.prefillButton.isEnabled)  # the previous job has finished
    view.clear()
    QTest.mouseClick(window.sessionPanel.prefillButton, Qt.MouseButton.LeftButton)
    wait_until(lambda: view.toPlainText() != "")
    return view.toPlainText()


def test_prefill_uses_the_template_then_the_raw_prompt_and_settings_remember(chat_window, loaded_models):
    window, settings_path = chat_window
    panel = window.sessionPanel
    tokenizer = loaded_models["llama"][1]  # same tokenizer files, without the template
    assert window.model_info.has_chat_template and panel.chatTemplateCheck.isEnabled()
    panel.promptEdit.setPlainText(PROMPT)
    panel.systemPromptEdit.setText(SYSTEM)

    text = _prefill_and_read(window)
    rendered = f"<|system|>\n{SYSTEM}<|endoftext|>\n<|user|>\n{PROMPT}<|endoftext|>\n<|assistant|>\n"
    assert text.startswith(rendered)
    assert len(panel.generatedView.starts) == len(tokenizer.encode(rendered)) + TOKENS

    panel.chatTemplateCheck.setChecked(False)
    text = _prefill_and_read(window)
    assert text.startswith(PROMPT) and "<|user|>" not in text
    assert len(panel.generatedView.starts) == len(tokenizer.encode(PROMPT)) + TOKENS

    assert window.save_settings() is None
    saved, warning = Settings.load(settings_path)
    assert warning is None and saved.chat_template is False and saved.system_prompt == SYSTEM
