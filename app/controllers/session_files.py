"""File ▸ Save Session… / Open Session…: a prefill kept on disk (kvcore.engine.session_file) and shown again later.

Saving writes the engine's prefill plus what is on screen (the compression view, the controls, the prompt, the
pin) atomically. Opening reads the file on the engine thread, checks its seal and every field of what it shows
(app.controllers.session_checks), restores it into a new Session (loading the saved model's local folder, after
its fingerprint matched, when another model is loaded; never a download), and only then replaces the current
session; the GUI then shows the
saved view as it was, with no prefill and no regeneration (forward-call counter 0). A bad file leaves everything
as it was and a dialog names the part that is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.controllers import file_dialogs
from app.controllers.host import Host
from app.controllers.pinning import PinController
from app.controllers.session_checks import SavedScreen, check_restored, check_saved
from app.controllers.sweep import SweepController
from app.engine import view_store
from app.engine.jobs import SESSION
from app.engine.thread import Job, JobContext, JobFailure, JobResult
from app.engine.view_model import LoadedModel, SequenceView, sequence_view
from kvcore.engine import session_file
from kvcore.engine.session import Session

SAVE, OPEN = "save_session", "open_session"
SAVE_SHORTCUT, OPEN_SHORTCUT = "Ctrl+S", "Ctrl+O"
FILTER = f"KV Lens session (*{session_file.SUFFIX})"
#: The fix for a sealed file whose fields are wrong: it was edited (and re-sealed) after KV Lens wrote it.
EDITED = "the file was edited after KV Lens saved it: open another session file, or prefill and save again"


@dataclass
class OpenedSession:
    """What the GUI shows after an open: the model (when it had to be loaded), the sequence and the saved screen."""

    path: str
    loaded: LoadedModel | None
    sequence: SequenceView
    saved: SavedScreen


def save_job(path: str, extra: dict[str, Any], arrays: dict[str, np.ndarray]) -> Job:
    """Write the engine's session and the caller's view to `path`; the view is dropped when it no longer
    matches the prefill (a prefill finished after the view was taken)."""

    def job(ctx: JobContext) -> str:
        session = ctx.state.get(SESSION)
        if session is None or not session.prompt_ids:
            raise ValueError("nothing to save: prefill a prompt first")
        view = extra.get("view") or {}
        if len(view.get("token_texts", ())) != len(session.prompt_ids) + len(session.dense_tokens):
            extra.pop("view", None)
        session_file.save_session(path, session, extra, arrays)
        return path

    return job


def open_job(path: str) -> Job:
    """Read `path` whole — seal, model, every field of what it shows — then restore it into a new Session over
    the loaded model (or the saved one, loaded only after its folder's fingerprint matched); the current session
    is replaced only when every part was read and checked."""

    def job(ctx: JobContext) -> OpenedSession:
        contents = session_file.read_contents(path)
        header, arrays = contents
        model = session_file.saved_model(header, path)
        try:
            saved = check_saved(header.get("extra"), session_file.extra_arrays(arrays))
        except ValueError as e:
            raise ValueError(f"{path}: {e}; {EDITED}") from e
        current = ctx.state.get(SESSION)
        loaded = None
        if current is not None and session_file.model_fingerprint(current.info.path) == model["fingerprint"]:
            session = Session(current.model, current.tokenizer, current.info)
        else:
            folder = session_file.model_folder(path, header)  # never a download, never another model
            ctx.progress(0.0, f"Loading {folder} for the session…")
            session = Session.load(folder)
            loaded = LoadedModel(folder, session.info)
        ctx.check_cancelled()
        session_file.open_session(path, session, contents)
        n_columns = len(session.prompt_ids) + len(session.dense_tokens)
        info = session.info
        try:
            check_restored(saved, info.n_layers, info.n_kv_heads, n_columns, len(session.prompt_ids))
        except ValueError as e:
            raise ValueError(f"{path}: {e}; {EDITED}") from e
        ctx.state[SESSION] = session
        return OpenedSession(path, loaded, sequence_view(session), saved)

    return job


class SessionFiles:
    """The Save Session / Open Session actions and what their results do to the window."""

    def __init__(self, host: Host, pinning: PinController, sweeping: SweepController) -> None:
        self.host = host
        self.pinning, self.sweeping = pinning, sweeping
        self.last_saved: str | None = None
        self.last_opened: str | None = None

    # -- save ---------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> int | None:
        """Save the session on screen to `path` (.kvlens is added when missing); a message when it cannot."""
        w = self.host
        path = Path(path)
        if path.suffix != session_file.SUFFIX:
            path = path.with_name(path.name + session_file.SUFFIX)
        view = self.pinning.current
        if not w.prefilled or view is None:
            w.error("Nothing to save", "Prefill a prompt first: a session file keeps a prefill.")
            return None
        if path.is_dir() or not path.parent.is_dir():
            w.error("Could not save the session", f"{path}: choose a file name in an existing folder.")
            return None
        fields, arrays = view_store.pack(view)
        extra: dict[str, Any] = {
            "view": fields,
            "prompt": w.sessionPanel.promptEdit.toPlainText(),
            "config": w.controls.config(),
            "auto_regenerate": w.controls.auto_regenerate(),
            "heatmap_view": w.heatmap.view(),
            "chat_template": w.sessionPanel.chatTemplateCheck.isChecked(),
            "system_prompt": w.sessionPanel.systemPromptEdit.text(),
        }
        pin = self.pinning.pin_state
        if pin is not None:
            extra["pin"] = view_store._plain({"config": pin.config, "label": pin.label, "cells": pin.cells})
            arrays["pin.kept"] = pin.kept
        w.status.show(f"Saving the session to {path}…")
        return w.engine.submit(
            SAVE, save_job(str(path), extra, arrays), on_result=self._on_saved, on_failure=self.on_failed
        )

    def save_dialog(self) -> None:
        path, _ = file_dialogs.save_path(
            self.host.widget,
            self.host.settings,
            file_dialogs.SESSIONS,
            "Save session",
            "session.kvlens",
            FILTER,
        )
        if path:
            self.save(path)

    # -- open ---------------------------------------------------------------------------------------

    def open(self, path: str | Path) -> int | None:
        """Open a session file: the view comes back without a prefill; a dialog names what is wrong."""
        path = Path(path)
        if not path.is_file():
            self.host.error("Could not open the session", f"{path}: no such file")
            return None
        return self.host.engine.submit(
            OPEN, open_job(str(path)), on_result=self._on_opened, on_failure=self.on_failed
        )

    def open_dialog(self) -> None:
        path = file_dialogs.open_path(
            self.host.widget, self.host.settings, file_dialogs.SESSIONS, "Open session", FILTER
        )
        if path:
            self.open(path)

    # -- results ------------------------------------------------------------------------------------

    def _on_saved(self, result: JobResult) -> None:
        self.last_saved = result.value
        self._remember(result.value)
        self.host.status.show(f"Saved the session to {result.value}")

    def _on_opened(self, result: JobResult) -> None:
        w = self.host
        opened: OpenedSession = result.value
        saved = opened.saved
        if opened.loaded is not None:
            w.show_loaded(opened.loaded)
        pins = self.pinning.clear("a session was opened")
        sweeps = self.sweeping.clear("a session was opened")
        panel = w.sessionPanel
        panel.promptEdit.setPlainText(saved.prompt)
        if saved.chat_template is not None:
            panel.chatTemplateCheck.setChecked(saved.chat_template)
        if saved.system_prompt is not None:
            panel.systemPromptEdit.setText(saved.system_prompt)
        w.sessionPanel.set_generated(opened.sequence.tokens, opened.sequence.prompt_len)
        w.status.set_timing("prefill", opened.sequence.prefill_ms)
        w.prefilled = True
        self._set_controls(saved)
        if saved.view is None:
            w.request_compression()
        else:
            w.show_compression(saved.view)
            if saved.pin is not None:
                self.pinning.restore(saved.pin)
            if saved.heatmap_view is not None:
                w.heatmap.set_view(saved.heatmap_view)
        self.last_opened = opened.path
        self._remember(opened.path)
        w.status.show(
            f"Opened {opened.path}: {opened.sequence.prompt_len} prompt tokens, no prefill needed. "
            f"{pins} {sweeps}".strip()
        )

    def _remember(self, path: str) -> None:
        self.host.settings.add_recent_session(str(Path(path).resolve()))
        self.host.rebuild_recent_menus()

    def _set_controls(self, saved: SavedScreen) -> None:
        """The saved controls (checked by session_checks), without the recompress their signals would ask for."""
        controls = self.host.controls
        check = controls.autoRegenerateCheck
        controls.blockSignals(True)
        check.blockSignals(True)
        try:
            if saved.config is not None:
                controls.set_config(saved.config)
            if saved.auto_regenerate is not None:
                controls.autoRegenerateCheck.setChecked(saved.auto_regenerate)
        except ValueError as e:
            self.host.status.warn(f"Session: saved controls not applied ({e})")
        finally:
            controls.blockSignals(False)
            check.blockSignals(False)

    def on_failed(self, failure: JobFailure) -> None:
        if failure.cancelled:
            self.host.status.show("Opening the session was cancelled; nothing changed.")
            return
        title = "Could not save the session" if failure.kind == SAVE else "Could not open the session"
        self.host.error(title, failure.message)
