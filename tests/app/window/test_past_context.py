"""The window's Prefill and Generate past the model's trained context: refused in a dialog naming the fix (fewer
tokens, a shorter prompt, or the 'Past trained context' box), run when the box is ticked, and the box is remembered."""

from __future__ import annotations

import json
import shutil

from PySide6.QtWidgets import QApplication

from app.settings import Settings
from app.window.main_window import MainWindow
from kvcore.engine.session import Session
from tests.app.waiting import wait_until

PROMPT = "def area(width, height):\n    return width * height\n"


def _finished(window: MainWindow, action) -> str | None:
    """Run `action` and wait until its job's outcome shows: the error text, or None when it ran."""
    window.last_error, shown = None, []
    real = window.sessionPanel.set_generated
    window.sessionPanel.set_generated = lambda tokens, n: (shown.append(len(tokens) - n), real(tokens, n))
    action()
    wait_until(lambda: window.last_error is not None or shown)
    window.sessionPanel.set_generated = real
    return window.last_error


def test_past_the_trained_context_is_a_dialog_naming_the_box_then_runs_when_ticked(
    qapp, model_dirs, tmp_path
):
    folder = shutil.copytree(model_dirs["llama"], tmp_path / "small")
    config = json.loads((folder / "config.json").read_text())
    n_prompt = len(Session.load(str(folder)).encode(PROMPT, chat_template=False))
    config["max_position_embeddings"] = n_prompt + 4
    (folder / "config.json").write_text(json.dumps(config))
    settings = tmp_path / "s.json"
    window = MainWindow(model=str(folder), settings_path=settings, continuation_tokens=6)
    window.show()
    panel = window.sessionPanel
    try:
        wait_until(lambda: window.model_info is not None and panel.prefillButton.isEnabled())
        panel.chatTemplateCheck.setChecked(False)
        panel.promptEdit.setPlainText(PROMPT)
        assert not panel.beyondContextCheck.isChecked()
        refused = _finished(window, window.prefill)
        assert refused is not None and "\n" not in refused and "--beyond-context" not in refused
        assert "shorten the prompt by 2 tokens" in refused and "tick 'Past trained context'" in refused
        window.continuation_tokens = 2
        assert _finished(window, window.prefill) is None
        refused = _finished(window, lambda: window.generate(4))
        assert (
            refused is not None
            and "generate at most 2 tokens" in refused
            and "'Past trained context'" in refused
        )
        panel.beyondContextCheck.setChecked(True)
        assert _finished(window, lambda: window.generate(4)) is None
        window.continuation_tokens = 6
        assert _finished(window, window.prefill) is None
        window.save_settings()
        assert Settings.load(settings)[0].beyond_context
    finally:
        window.close()
        QApplication.processEvents()
