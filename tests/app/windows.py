"""A real window on the demo model (the llama test model when the demo is absent) next to a Session that the
test thread prefills with the same prompt: the independent reference a window test compares with."""

from __future__ import annotations

from app.window.main_window import MainWindow
from kvcore.engine.session import Session
from kvcore.resources import demo_model_dir
from tests.app.waiting import wait_until

CODE_PROMPT = (
    "def area(width, height):\n    return width * height\n\n\n"
    "class Rectangle:\n    def __init__(self, width, height):\n        self.width = width\n"
    "        self.height = height\n\n    def area(self):\n        return "
)


def window_and_reference(model_dirs, settings_path, tokens: int, prompt: str = CODE_PROMPT):
    """(window, ref): a shown MainWindow loaded and prefilled through its own Prefill, its first result drawn,
    and a Session loaded and prefilled in this thread."""
    demo = demo_model_dir()
    model = str(demo) if (demo / "config.json").is_file() else str(model_dirs["llama"])
    ref = Session.load(model)
    ref.prefill(prompt, n_tokens=tokens)
    window = MainWindow(model=model, settings_path=settings_path, continuation_tokens=tokens)
    window.show()
    wait_until(lambda: window.model_info is not None)
    window.sessionPanel.promptEdit.setPlainText(prompt)
    window.prefill()
    wait_until(lambda: window.displayed_ids)
    return window, ref


def shown_after(window: MainWindow, action) -> int:
    """Run `action` (which changes the controls) and wait until its compress request is the one drawn."""
    action()
    rid = window.engine.latest_id("compress")
    wait_until(lambda: window.displayed_ids and window.displayed_ids[-1] == rid)
    return rid
