"""Session panel: pick and load a model, edit the prompt, prefill / step / generate, see the tokens."""

from __future__ import annotations

import bisect
import os
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QColor, QMouseEvent, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from kvcore.defaults import DEFAULT_CONTINUATION_TOKENS
from kvcore.model.loading import hf_cache_dir
from kvcore.samples import sample_prompts

OPEN_FOLDER = "Open folder…"
PROMPT_TOKEN_COLOUR = QColor(130, 130, 130)
HOVER_BACKGROUND = QColor(0, 200, 255, 90)
_KIND_ROLE = Qt.ItemDataRole.UserRole + 1  # "demo", "recent", "cache" or "open"


def find_cached_models(cache: Path | None = None) -> list[tuple[str, Path]]:
    """(repo id, snapshot folder) for every cached snapshot with config.json and safetensors weights.
    Reads the disk only; never the network."""
    root = cache if cache is not None else hf_cache_dir()
    found = []
    try:
        repos = sorted(root.glob("models--*"))
    except OSError:
        return []
    for repo in repos:
        snapshots = sorted((repo / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime, reverse=True)
        for snap in snapshots:
            if (snap / "config.json").is_file() and any(snap.glob("*.safetensors")):
                found.append((repo.name[len("models--") :].replace("--", "/"), snap))
                break
    return found


def _shown(token: str) -> str:
    """A token as the view inserts it: every line break (\\r\\n, \\r, \\n) one \\n, so a break split across two
    tokens stays two breaks and each token's length is its own."""
    return token.replace("\r\n", "\n").replace("\r", "\n")


def text_spans(tokens: list[str]) -> tuple[list[int], list[int]]:
    """(starts, ends): each shown token's document position range when inserted back to back. A QTextDocument
    counts UTF-16 code units (a character outside the BMP takes two) and one position per paragraph break."""
    starts, ends, pos = [], [], 0
    for token in tokens:
        starts.append(pos)
        pos += len(_shown(token).encode("utf-16-le")) // 2
        ends.append(pos)
    return starts, ends


class _TokenView(QTextEdit):
    """Read-only token text; reports which token position is under the mouse."""

    tokenHovered = Signal(int)  # noqa: N815

    def __init__(self) -> None:
        super().__init__(objectName="generatedTextView")
        self.setReadOnly(True)
        self.setMouseTracking(True)
        self.viewport().setMouseTracking(True)
        self.viewport().installEventFilter(self)
        self.starts: list[int] = []
        self.ends: list[int] = []
        self._hovered = -1

    def token_at(self, char_pos: int) -> int:
        i = bisect.bisect_right(self.starts, char_pos) - 1
        return i if 0 <= i < len(self.ends) and char_pos < self.ends[i] else -1

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt API)
        if obj is self.viewport():
            if event.type() == QEvent.Type.MouseMove and isinstance(event, QMouseEvent):
                self._set_hovered(
                    self.token_at(self.cursorForPosition(event.position().toPoint()).position())
                )
            elif event.type() == QEvent.Type.Leave:
                self._set_hovered(-1)
        return super().eventFilter(obj, event)

    def _set_hovered(self, token: int) -> None:
        if token == self._hovered:
            return
        self._hovered = token
        selections = []
        if token >= 0:
            sel = QTextEdit.ExtraSelection()
            sel.cursor = QTextCursor(self.document())
            sel.cursor.setPosition(self.starts[token])
            sel.cursor.setPosition(self.ends[token], QTextCursor.MoveMode.KeepAnchor)
            sel.format.setBackground(HOVER_BACKGROUND)
            selections.append(sel)
        self.setExtraSelections(selections)
        self.tokenHovered.emit(token)


class SessionPanel(QWidget):
    """Model choice, prompt and run buttons. Emits requests; the main window runs them on the engine."""

    loadRequested = Signal(str)  # noqa: N815
    prefillRequested = Signal(str)  # noqa: N815
    stepRequested = Signal()  # noqa: N815
    generateRequested = Signal(int)  # noqa: N815
    cancelRequested = Signal()  # noqa: N815
    tokenHovered = Signal(int)  # noqa: N815  (position in the sequence; -1 when the mouse leaves)

    def __init__(
        self,
        demo_model: str | None = None,
        recent_models: list[str] | None = None,
        prompts_dir: str | os.PathLike[str] | None = None,
        hf_cache: Path | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("sessionPanel")
        self._build_ui()
        self.set_models(demo_model, recent_models or [], find_cached_models(hf_cache))
        self._load_prompts(Path(prompts_dir) if prompts_dir else None)
        self.set_busy(False)
        self._set_session_state(loaded=False, prefilled=False)

    def _build_ui(self) -> None:
        self.modelCombo = QComboBox(objectName="modelCombo")
        self.modelCombo.setEditable(True)
        self.modelCombo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.modelCombo.setToolTip("A model folder, a cached Hugging Face model, or the bundled demo model")
        self.loadButton = QPushButton("Load", objectName="loadButton")
        self.modelLabel = QLabel("No model loaded", objectName="modelLabel")

        self.samplePromptCombo = QComboBox(objectName="samplePromptCombo")
        for combo in (self.modelCombo, self.samplePromptCombo):  # a long model path must not widen the window
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(12)
        self.promptEdit = QPlainTextEdit(objectName="promptEdit")
        self.promptEdit.setPlaceholderText("Prompt…")
        self.chatTemplateCheck = QCheckBox("Chat template", objectName="chatTemplateCheck")
        self.chatTemplateCheck.setChecked(True)
        self.systemPromptEdit = QLineEdit(objectName="systemPromptEdit")
        self.systemPromptEdit.setPlaceholderText("System prompt (optional)")
        self._has_template = True
        self.prefillButton = QPushButton("Prefill", objectName="prefillButton")
        self.stepButton = QPushButton("Step", objectName="stepButton")
        self.generateButton = QPushButton("Generate", objectName="generateButton")
        self.generateCountSpin = QSpinBox(objectName="generateCountSpin")
        self.generateCountSpin.setRange(1, 4096)
        self.generateCountSpin.setValue(DEFAULT_CONTINUATION_TOKENS)
        self.beyondContextCheck = QCheckBox("Past trained context", objectName="beyondContextCheck")
        self.beyondContextCheck.setToolTip(
            "Let Prefill and Generate run past the model's trained context (max_position_embeddings): RoPE "
            "extrapolates to positions the model never saw, so the quality there is yours to judge"
        )
        self.busyIndicator = QProgressBar(objectName="busyIndicator")
        self.busyIndicator.setRange(0, 0)
        self.busyIndicator.setTextVisible(False)
        self.busyLabel = QLabel(objectName="busyLabel")
        self.cancelButton = QPushButton("Cancel", objectName="cancelButton")
        self.generatedView = _TokenView()

        for button in (
            self.loadButton,
            self.prefillButton,
            self.stepButton,
            self.generateButton,
            self.cancelButton,
        ):
            # As wide as the text needs, not the style's 80 px: the panel must fit a laptop's left column.
            button.setMinimumWidth(button.fontMetrics().horizontalAdvance(button.text()) + 24)
        # A long job name must not widen the panel: the label shows what fits, the status bar all of it.
        self.busyLabel.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        model_row = QHBoxLayout()
        model_row.addWidget(self.modelCombo, 1)
        model_row.addWidget(self.loadButton)
        run_row = QHBoxLayout()
        for w in (self.prefillButton, self.stepButton, self.generateButton, self.generateCountSpin):
            run_row.addWidget(w)
        busy_row = QHBoxLayout()
        busy_row.addWidget(self.busyIndicator, 1)
        busy_row.addWidget(self.busyLabel)
        busy_row.addWidget(self.cancelButton)
        layout = QVBoxLayout(self)
        layout.addLayout(model_row)
        layout.addWidget(self.modelLabel)
        layout.addWidget(self.samplePromptCombo)
        layout.addWidget(self.promptEdit, 1)
        chat_row = QHBoxLayout()
        chat_row.addWidget(self.chatTemplateCheck)
        chat_row.addWidget(self.systemPromptEdit, 1)
        layout.addLayout(chat_row)
        layout.addLayout(run_row)
        layout.addWidget(self.beyondContextCheck)  # its own line: the run row already fills a laptop's column
        layout.addLayout(busy_row)
        layout.addWidget(QLabel("Tokens (hover to mark in the heatmap)"))
        layout.addWidget(self.generatedView, 2)

        self.modelCombo.activated.connect(self._on_model_activated)
        self.loadButton.clicked.connect(self._request_load)
        self.samplePromptCombo.activated.connect(self._on_sample_chosen)
        self.prefillButton.clicked.connect(lambda: self.prefillRequested.emit(self.promptEdit.toPlainText()))
        self.stepButton.clicked.connect(self.stepRequested.emit)
        self.generateButton.clicked.connect(
            lambda: self.generateRequested.emit(self.generateCountSpin.value())
        )
        self.cancelButton.clicked.connect(self.cancelRequested.emit)
        self.chatTemplateCheck.toggled.connect(lambda _: self._update_chat_widgets())
        self.generatedView.tokenHovered.connect(self.tokenHovered.emit)

    # -- public API -------------------------------------------------------------------------------

    def set_models(self, demo_model: str | None, recent: list[str], cached: list[tuple[str, Path]]) -> None:
        """Fill the model list: demo first, then recent, then the HF cache, then 'Open folder…'.
        Each entry's data is the path or id passed to loadRequested."""
        combo = self.modelCombo
        combo.clear()
        seen: set[str] = set()

        def add(text: str, value: str, kind: str) -> None:
            if value in seen:
                return
            seen.add(value)
            combo.addItem(text, value)
            combo.setItemData(combo.count() - 1, kind, _KIND_ROLE)
            combo.setItemData(combo.count() - 1, value, Qt.ItemDataRole.ToolTipRole)

        if demo_model:
            add(f"Demo model ({Path(demo_model).name})", demo_model, "demo")
        for name in recent:
            add(name, name, "recent")
        for repo_id, snapshot in cached:
            add(f"{repo_id} (HF cache)", str(snapshot), "cache")
        combo.addItem(OPEN_FOLDER, None)
        combo.setItemData(combo.count() - 1, "open", _KIND_ROLE)
        combo.setCurrentIndex(0)
        combo.lineEdit().setCursorPosition(0)  # a long name shows its start

    def model_entries(self) -> list[tuple[str, str | None, str]]:
        """(text, value, kind) for every entry, in order."""
        combo = self.modelCombo
        return [
            (combo.itemText(i), combo.itemData(i), combo.itemData(i, _KIND_ROLE))
            for i in range(combo.count())
        ]

    def set_chat_template_available(self, available: bool) -> None:
        """Enable the chat template box and system prompt only when the loaded tokenizer has a template; the
        user's choice is kept for the next model that has one."""
        self._has_template = available
        self._update_chat_widgets()

    def chat_template(self) -> tuple[bool, str | None]:
        """(apply the template, system prompt or None) as the next prefill should use them: off when the
        tokenizer has none, no system prompt when the box is off or the field is blank."""
        use = self._has_template and self.chatTemplateCheck.isChecked()
        system = self.systemPromptEdit.text()
        return use, (system if use and system.strip() else None)

    def beyond_context(self) -> bool:
        """Whether Prefill and Generate may run past the model's trained context (the "Past trained context" box)."""
        return self.beyondContextCheck.isChecked()

    def _update_chat_widgets(self) -> None:
        box = self.chatTemplateCheck
        box.setEnabled(self._has_template)
        self.systemPromptEdit.setEnabled(self._has_template and box.isChecked())
        box.setToolTip(
            "Wrap the prompt in the tokenizer's chat template as a user message, as mlx_lm.generate does; "
            "the template's own tokens are positions like any other"
            if self._has_template
            else "This model's tokenizer has no chat template: the prompt is used as it is"
        )

    def set_busy(self, busy: bool, text: str = "") -> None:
        """Show the busy indicator and Cancel while the engine works; run buttons are disabled meanwhile."""
        self._busy = busy
        self.busyIndicator.setVisible(busy)
        self.cancelButton.setVisible(busy)
        self.busyLabel.setVisible(busy)
        self.busyLabel.setText(text)
        self._update_buttons()

    def set_model_loaded(self, name: str) -> None:
        """A model is ready: Prefill becomes possible, the previous generation is cleared."""
        self.modelLabel.setText(f"Loaded: {name}")
        self.generatedView.clear()
        self.generatedView.starts, self.generatedView.ends = [], []
        self._set_session_state(loaded=True, prefilled=False)

    def set_generated(self, tokens: list[str], prompt_len: int) -> None:
        """Show the whole sequence (prompt tokens greyed, then generated ones); enables Step/Generate.

        Two inserts (prompt, continuation) rather than one per token, with each token's character range
        computed in Python (`text_spans`): 32k tokens are built in tens of milliseconds, not seconds.
        """
        view = self.generatedView
        view.clear()
        cursor = QTextCursor(view.document())
        prompt_fmt, gen_fmt = QTextCharFormat(), QTextCharFormat()
        prompt_fmt.setForeground(PROMPT_TOKEN_COLOUR)
        view.setUpdatesEnabled(False)
        try:
            cursor.insertText("".join(map(_shown, tokens[:prompt_len])), prompt_fmt)
            cursor.insertText("".join(map(_shown, tokens[prompt_len:])), gen_fmt)
        finally:
            view.setUpdatesEnabled(True)
        view.starts, view.ends = text_spans(tokens)
        view.moveCursor(QTextCursor.MoveOperation.End)
        self._set_session_state(loaded=True, prefilled=True)

    def token_span(self, position: int) -> tuple[int, int]:
        """Character range of token `position` in the generated-text view."""
        return self.generatedView.starts[position], self.generatedView.ends[position]

    # -- internals --------------------------------------------------------------------------------

    def _set_session_state(self, loaded: bool, prefilled: bool) -> None:
        self._loaded, self._prefilled = loaded, prefilled
        self._update_buttons()

    def _update_buttons(self) -> None:
        busy = getattr(self, "_busy", False)
        loaded, prefilled = getattr(self, "_loaded", False), getattr(self, "_prefilled", False)
        self.loadButton.setEnabled(not busy)
        self.prefillButton.setEnabled(loaded and not busy)
        self.stepButton.setEnabled(prefilled and not busy)
        self.generateButton.setEnabled(prefilled and not busy)
        self.prefillButton.setToolTip("" if loaded else "Load a model first")
        self.stepButton.setToolTip("" if prefilled else "Prefill a prompt first")
        self.generateButton.setToolTip("" if prefilled else "Prefill a prompt first")

    def _load_prompts(self, folder: Path | None) -> None:
        combo = self.samplePromptCombo
        combo.clear()
        samples = sample_prompts(folder)
        combo.addItem("Sample prompts…" if samples else "No sample prompts", None)
        for sample in samples:
            combo.addItem(sample.title, str(sample.path))
            if sample.note:
                combo.setItemData(combo.count() - 1, sample.note, Qt.ItemDataRole.ToolTipRole)
        combo.setEnabled(bool(samples))

    def _on_sample_chosen(self, index: int) -> None:
        path = self.samplePromptCombo.itemData(index)
        if path:
            try:
                self.promptEdit.setPlainText(Path(path).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                self.busyLabel.setText(f"Could not read {path}: {exc}")
                self.busyLabel.setVisible(True)

    def _on_model_activated(self, index: int) -> None:
        if self.modelCombo.itemData(index, _KIND_ROLE) == "open":
            self._open_folder()

    def _open_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a model folder")
        if not folder:
            self.modelCombo.setCurrentIndex(0)
            return
        self.modelCombo.insertItem(0, folder, folder)
        self.modelCombo.setItemData(0, "recent", _KIND_ROLE)
        self.modelCombo.setCurrentIndex(0)
        self.loadRequested.emit(folder)

    def _request_load(self) -> None:
        combo = self.modelCombo
        text = combo.currentText().strip()
        index = combo.findText(text)
        if index >= 0 and combo.itemData(index, _KIND_ROLE) == "open":
            self._open_folder()
            return
        value = combo.itemData(index) if index >= 0 else None
        target = value or text
        if target:
            self.loadRequested.emit(target)
