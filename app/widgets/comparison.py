"""Dense vs compressed continuations side by side with the per-token strip under them, and the
quality/cost metrics of the last run."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSplitter,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.engine.view_model import TokenSteps
from app.widgets.session_panel import HOVER_BACKGROUND
from app.widgets.token_strip import TokenStrip

DIVERGENCE_BACKGROUND = QColor(255, 120, 90)
AFTER_DIVERGENCE_FOREGROUND = QColor(150, 150, 150)


class ComparisonView(QWidget):
    """Two read-only views; the first token where the compressed run differs is marked in both. Under them
    the per-token strip; the token hovered there is marked in both texts."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("comparisonView")
        self.denseTextView = self._text_view("denseTextView")
        self.compressedTextView = self._text_view("compressedTextView")
        self.strip = TokenStrip()
        self._spans: dict[str, list[tuple[int, int]]] = {"dense": [], "compressed": []}
        self._marked: int | None = None
        texts = QWidget()
        row = QHBoxLayout(texts)
        row.setContentsMargins(0, 0, 0, 0)
        for title, view in (
            ("Dense cache", self.denseTextView),
            ("Compressed cache", self.compressedTextView),
        ):
            column = QVBoxLayout()
            column.addWidget(QLabel(f"<b>{title}</b>"))
            column.addWidget(view, 1)
            row.addLayout(column, 1)
        splitter = QSplitter(Qt.Orientation.Vertical, objectName="comparisonSplitter")
        splitter.addWidget(texts)
        splitter.addWidget(self.strip)
        splitter.setStretchFactor(0, 1)
        splitter.setStretchFactor(1, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(splitter)
        self.strip.tokenHovered.connect(self.mark_token)
        # Scroll together so the same region of both continuations stays in view.
        dense_bar = self.denseTextView.verticalScrollBar()
        compressed_bar = self.compressedTextView.verticalScrollBar()
        dense_bar.valueChanged.connect(compressed_bar.setValue)
        compressed_bar.valueChanged.connect(dense_bar.setValue)

    @staticmethod
    def _text_view(name: str) -> QPlainTextEdit:
        view = QPlainTextEdit(objectName=name)
        view.setReadOnly(True)
        view.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        return view

    def set_texts(
        self, dense_tokens: list[str], compressed_tokens: list[str], first_divergence: int | None
    ) -> None:
        """Show both continuations; token `first_divergence` gets a coloured background in both and
        the compressed text after it is greyed (None: the runs agree)."""
        self._spans["dense"] = self._fill(
            self.denseTextView, dense_tokens, first_divergence, grey_after=False
        )
        self._spans["compressed"] = self._fill(
            self.compressedTextView, compressed_tokens, first_divergence, grey_after=True
        )
        tip = (
            "The continuations agree"
            if first_divergence is None
            else f"First divergence at token {first_divergence}"
        )
        self.setToolTip(tip)
        self.mark_token(-1 if self._marked is None else self._marked)

    def set_steps(self, steps: TokenSteps | None) -> None:
        """Per-token KL, agreement and top-5 for the strip (None: not regenerated)."""
        self.strip.set_steps(steps)

    def mark_token(self, index: int) -> None:
        """Mark generated token `index` in both texts (where it exists) and scroll it into view; -1 unmarks."""
        self._marked = index if index >= 0 else None
        for which, view in (("dense", self.denseTextView), ("compressed", self.compressedTextView)):
            spans = self._spans[which]
            if index < 0 or index >= len(spans):
                view.setExtraSelections([])
                continue
            sel = QTextEdit.ExtraSelection()
            sel.cursor = QTextCursor(view.document())
            sel.cursor.setPosition(spans[index][0])
            sel.cursor.setPosition(spans[index][1], QTextCursor.MoveMode.KeepAnchor)
            sel.format.setBackground(HOVER_BACKGROUND)
            view.setExtraSelections([sel])
            if which == "dense":
                cursor = QTextCursor(view.document())
                cursor.setPosition(spans[index][0])
                view.setTextCursor(cursor)
                view.ensureCursorVisible()

    def marked_token(self) -> int | None:
        """The generated token marked from the strip, or None."""
        return self._marked

    def marked_span(self, which: str) -> tuple[int, int] | None:
        """(start, end) of the marked token's highlight in the 'dense' or 'compressed' view, or None."""
        view = self.denseTextView if which == "dense" else self.compressedTextView
        selections = view.extraSelections()
        if not selections:
            return None
        cursor = selections[0].cursor
        return cursor.selectionStart(), cursor.selectionEnd()

    def token_span(self, which: str, index: int) -> tuple[int, int]:
        """(start, end) character offsets of token `index` in the 'dense' or 'compressed' view."""
        return self._spans[which][index]

    @staticmethod
    def _fill(
        view: QPlainTextEdit, tokens: list[str], divergence: int | None, grey_after: bool
    ) -> list[tuple[int, int]]:
        view.clear()
        cursor = QTextCursor(view.document())
        plain, marked, after = QTextCharFormat(), QTextCharFormat(), QTextCharFormat()
        marked.setBackground(DIVERGENCE_BACKGROUND)
        after.setForeground(AFTER_DIVERGENCE_FOREGROUND)
        spans = []
        for i, token in enumerate(tokens):
            if divergence is not None and i == divergence:
                fmt = marked
            elif divergence is not None and i > divergence and grey_after:
                fmt = after
            else:
                fmt = plain
            start = cursor.position()
            cursor.insertText(token, fmt)
            spans.append((start, cursor.position()))
        return spans


def _bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.2f} {unit}"
        value /= 1024
    return str(value)


_DENSE_TITLE = "Bytes dense"
_ROWS: tuple[tuple[str, str, Any], ...] = (
    ("bytes_dense", _DENSE_TITLE, _bytes),
    ("bytes_compressed", "Bytes compressed", _bytes),
    ("compression_ratio", "Compression ratio", lambda v: f"{v:.2f}×"),
    ("bytes_not_compressible", "Not compressible", _bytes),
    ("compressible_ratio", "Ratio, compressible layers", lambda v: f"{v:.2f}×"),
    ("agreement", "Top-1 agreement", lambda v: f"{100 * v:.1f} %"),
    ("kl_mean", "KL mean", lambda v: f"{v:.4g}"),
    ("kl_max", "KL max", lambda v: f"{v:.4g}"),
    ("nll_delta", "NLL delta", lambda v: f"{v:+.4g}"),
    ("first_divergence", "First divergence", lambda v: f"token {v}"),
    ("compared_tokens", "Tokens compared", str),
    ("recompress_ms", "Recompress", lambda v: f"{v:.1f} ms"),
    ("regenerate_ms", "Regenerate", lambda v: f"{v:.1f} ms"),
)
MISSING = "—"
#: What the byte rows measure against; {dtype} is the dense cache's element type ("dense" before a model).
_BASELINE_TIPS = {
    "bytes_dense": "Bytes of the {dtype} cache: every position of every layer, unquantized",
    "bytes_compressed": "Bytes of the compressed cache: kept positions, packed where quantized (else as in the {dtype} cache)",
    "compression_ratio": "Bytes of the {dtype} cache ÷ bytes compressed (e.g. 4× = a quarter of the {dtype} cache)",
    "compressible_ratio": "The same ratio over the layers a method may compress, of the {dtype} cache",
}


class MetricsPanel(QWidget):
    """Cost and quality of the current setting against the dense cache; missing values show '—'."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("metricsPanel")
        form = QFormLayout(self)
        self._values: dict[str, QLabel] = {}
        self._titles: dict[str, str] = {}
        self._title_labels: dict[str, QLabel] = {}
        for key, title, _ in _ROWS:
            label = QLabel(MISSING, objectName=f"metric_{key}")
            label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self._title_labels[key] = QLabel(title)
            form.addRow(self._title_labels[key], label)
            self._values[key] = label
            self._titles[key] = title
        self.set_baseline(None)

    def set_baseline(self, dtype: str | None) -> None:
        """Say what the ratios are of: the dense cache stored as `dtype` ('float32' on MLX's CPU, 'bfloat16' on a
        Mac); 'Bytes dense' names it. None (no model): the dense cache, unnamed."""
        self._titles["bytes_dense"] = f"{_DENSE_TITLE} ({dtype})" if dtype else _DENSE_TITLE
        self._title_labels["bytes_dense"].setText(self._titles["bytes_dense"])
        for key, tip in _BASELINE_TIPS.items():
            text = tip.format(dtype=dtype or "dense")
            self._title_labels[key].setToolTip(text)
            self._values[key].setToolTip(text)

    def tooltip(self, key: str) -> str:
        """The tooltip of one metric row (its title and its value say the same)."""
        return self._values[key].toolTip()

    def set_metrics(self, metrics: dict[str, Any]) -> None:
        """Show `metrics`; a first_divergence of None (present) means the runs never diverged."""
        for key, _, fmt in _ROWS:
            value = metrics.get(key)
            if key == "first_divergence" and key in metrics and value is None:
                text = "none"
            elif value is None:
                text = MISSING
            else:
                try:
                    text = fmt(value)
                except (TypeError, ValueError):
                    text = str(value)
            self._values[key].setText(text)
        skip = metrics.get("first_compressed_step")
        self._values["compared_tokens"].setToolTip(
            f"Tokens 0–{skip - 1} come from the dense prefill ({metrics.get('schedule')} schedule) and cannot diverge"
            if skip
            else "Every generated token sees the compressed cache"
        )

    def value_text(self, key: str) -> str:
        """The text shown for one metric key."""
        return self._values[key].text()

    def text(self) -> str:
        """All metrics as 'Title: value' lines (for tests and copying)."""
        return "\n".join(f"{self._titles[key]}: {self._values[key].text()}" for key, _, _ in _ROWS)
