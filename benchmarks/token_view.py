"""Time to show 32,768 tokens in the session panel's token view, against the per-token insertion it replaced.

Run: QT_QPA_PLATFORM=offscreen .venv/bin/python -m benchmarks.token_view
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

N_TOKENS, PROMPT_LEN, REPEATS = 32_768, 32_000, 5
_WORDS = (
    "def",
    " main",
    "(",
    "argv",
    "):",
    "\n",
    "    ",
    "return",
    " sum",
    " x",
    " *",
    " for",
    " in",
    "é",
    "\t",
)


def _per_token(view, tokens: list[str], prompt_len: int) -> None:  # noqa: ANN001
    """The previous implementation: one insertText per token."""
    from PySide6.QtGui import QTextCharFormat, QTextCursor

    from app.widgets.session_panel import PROMPT_TOKEN_COLOUR

    view.clear()
    cursor = QTextCursor(view.document())
    prompt_fmt, gen_fmt = QTextCharFormat(), QTextCharFormat()
    prompt_fmt.setForeground(PROMPT_TOKEN_COLOUR)
    for i, token in enumerate(tokens):
        cursor.insertText(token, prompt_fmt if i < prompt_len else gen_fmt)


def _median_ms(fn) -> float:  # noqa: ANN001
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    from PySide6.QtWidgets import QApplication

    from app.widgets.session_panel import SessionPanel

    app = QApplication.instance() or QApplication([])
    tokens = [_WORDS[i % len(_WORDS)] for i in range(N_TOKENS)]
    panel = SessionPanel()
    panel.resize(500, 800)
    panel.show()
    app.processEvents()

    def new() -> None:
        panel.set_generated(tokens, PROMPT_LEN)
        app.processEvents()

    def old() -> None:
        _per_token(panel.generatedView, tokens, PROMPT_LEN)
        app.processEvents()

    new_ms, old_ms = _median_ms(new), _median_ms(old)
    print(f"token view, {N_TOKENS:,} tokens, median of {REPEATS}:")
    print(f"  two inserts + spans in Python : {new_ms:8.1f} ms")
    print(f"  one insert per token          : {old_ms:8.1f} ms  ({old_ms / new_ms:.1f}x slower)")
    panel.close()


if __name__ == "__main__":
    main()
