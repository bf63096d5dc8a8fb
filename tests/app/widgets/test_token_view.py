"""The token view's spans: built in two inserts, each token's range equals what per-token insertion gives."""

from __future__ import annotations

from PySide6.QtGui import QTextCursor, QTextDocument

from app.widgets.session_panel import SessionPanel

TOKENS = [
    "\r",
    "\n",
    "a",
    "é",
    "😀x",
    "\r\n",
    "\t",
    "\u2028",
    "ok",
    "",
    "\x00",
    "\ufffd",
    " def",
    "\n\n",
    "z",
]


def _per_token_spans(tokens: list[str]) -> list[tuple[int, int, str]]:
    """The independent reference: insert token by token, as the view used to, and read each range back."""
    doc = QTextDocument()
    cursor = QTextCursor(doc)
    spans = []
    for token in tokens:
        start = cursor.position()
        cursor.insertText(token)
        spans.append((start, cursor.position()))
    texts = []
    for start, end in spans:
        c = QTextCursor(doc)
        c.setPosition(start)
        c.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        texts.append((start, end, c.selectedText()))
    return texts


def test_spans_match_per_token_insertion_and_grey_the_prompt(qtbot):
    panel = SessionPanel()
    qtbot.addWidget(panel)
    tokens = TOKENS * 3
    panel.set_generated(tokens, prompt_len=7)
    view = panel.generatedView
    reference = _per_token_spans(tokens)
    assert list(zip(view.starts, view.ends, strict=True)) == [(s, e) for s, e, _ in reference]
    for i, (start, end, text) in enumerate(reference):
        c = QTextCursor(view.document())
        c.setPosition(start)
        c.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        assert c.selectedText() == text, i
        assert panel.token_span(i) == (start, end)
    first_generated = QTextCursor(view.document())
    first_generated.setPosition(view.ends[6] + 1)
    prompt = QTextCursor(view.document())
    prompt.setPosition(view.starts[2] + 1)
    assert prompt.charFormat().foreground().color() != first_generated.charFormat().foreground().color()
    assert view.token_at(view.starts[4]) == 4 and view.token_at(view.ends[-1]) == -1
