"""Issue 42, items 4 and 6: a session file edited and re-sealed (with kvcore's own seal) so that its fields have
the right keys and the wrong types or ranges is refused whole — a dialog names the field and the fix — and the
engine's session, the pin and the view on screen stay as they were. A file naming a model it cannot vouch for is
refused before any load: a hub id is never fetched, a folder that now holds another model is never loaded."""

from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest
from PySide6.QtWidgets import QApplication

from app.controllers.session_files import EDITED
from tests.app.controllers import test_session_files as sessions
from tests.app.controllers.test_session_files import (
    _assert_same_screen,
    _close,
    _engine_session,
    _forge,
    _screen,
    _window,
)
from tests.app.waiting import wait_until

saved = sessions.saved  # the saved good session (a module fixture), forged below


def _view(h: dict) -> dict:
    return h["extra"]["view"]


def _steps(h: dict) -> dict:
    return _view(h)["token_steps"]["dataclass"]


def _sequence(h: dict) -> dict:
    return _view(h)["sequence"]["dataclass"]


def _infinite_keys(a: dict) -> None:
    keys = np.array(a["cache.0.keys.0"])
    keys[0, 0, 1, 0] = np.inf
    a["cache.0.keys.0"] = mx.array(keys)


def _set(d_of, key, value):
    return lambda h, a: d_of(h).__setitem__(key, value)


#: case -> (edit of the sealed header and arrays, a fragment the dialog must show)
FORGED = {
    "stats_rows of ints": (_set(_view, "stats_rows", [1, 2, 3]), "view: stats_rows must be"),
    "dense_texts null": (_set(_view, "dense_texts", None), "view: dense_texts must be"),
    "first_divergence text": (_set(_view, "first_divergence", "x"), "view: first_divergence must be"),
    "3x3 token_steps.kl": (
        lambda h, a: a.update({"extra.view.token_steps.kl": mx.zeros((3, 3))}),
        "view: token_steps.kl must be",
    ),
    "n_prompt_positions 1e9": (_set(_view, "n_prompt_positions", 1e9), "view: n_prompt_positions must be"),
    "controls method list": (
        lambda h, a: h["extra"]["config"].__setitem__("method", ["a"]),
        "extra: config: unknown method",
    ),
    "view config method list": (
        lambda h, a: _view(h)["config"].__setitem__("method", ["a"]),
        "view: config: unknown method",
    ),
    "token_texts of ints": (
        lambda h, a: _view(h).__setitem__("token_texts", list(range(len(_view(h)["token_texts"])))),
        "view: token_texts must be",
    ),
    "kl_mean text": (
        lambda h, a: _view(h)["metrics"].__setitem__("kl_mean", "abc"),
        "view: metrics.kl_mean must be a number",
    ),
    "negative prompt_len": (_set(_sequence, "prompt_len", -3), "view: sequence.prompt_len must be"),
    "prompt a dict": (lambda h, a: h["extra"].__setitem__("prompt", {"a": 1}), "extra: prompt must be text"),
    "infinite cache keys": (lambda h, a: _infinite_keys(a), "NaN or infinite"),
    "kv-heads for another mask": (_set(_view, "n_kv_heads", 3), "view: kept must be"),
    "float kept mask": (
        lambda h, a: a.update({"extra.view.kept": a["extra.view.kept"].astype(mx.float32)}),
        "view: kept must be a bool array",
    ),
    "infinite scores": (
        lambda h, a: a.update({"extra.view.scores": mx.full(a["extra.view.kept"].shape, np.inf)}),
        "view: scores must be",
    ),
    "unknown heatmap view": (
        lambda h, a: h["extra"].__setitem__("heatmap_view", "bogus"),
        "extra: heatmap_view must be one of",
    ),
    "chat_template text": (
        lambda h, a: h["extra"].__setitem__("chat_template", "yes"),
        "extra: chat_template must be true or false",
    ),
    "auto_regenerate 1": (
        lambda h, a: h["extra"].__setitem__("auto_regenerate", 1),
        "extra: auto_regenerate must be",
    ),
    "system_prompt number": (lambda h, a: h["extra"].__setitem__("system_prompt", 5), "extra: system_prompt"),
    "pin label number": (lambda h, a: h["extra"]["pin"].__setitem__("label", 5), "pin: label must be text"),
    "pin ratio 7": (lambda h, a: h["extra"]["pin"]["config"].__setitem__("ratio", 7), "pin: config: ratio"),
    "not_compressible out of range": (_set(_view, "not_compressible", [99]), "view: not_compressible"),
    "row_labels short": (_set(_view, "row_labels", ["L0 h0"]), "view: row_labels must be"),
    "negative top ids": (
        lambda h, a: a.update(
            {"extra.view.token_steps.dense_top_ids": -a["extra.view.token_steps.dense_top_ids"] - 1}
        ),
        "view: token_steps.dense_top_ids must be",
    ),
    "view a list": (
        lambda h, a: h["extra"].__setitem__("view", []),
        "view: CompressionView must be an object",
    ),
    "first_compressed_step text": (
        lambda h, a: _view(h)["metrics"].__setitem__("first_compressed_step", "2"),
        "view: metrics.first_compressed_step",
    ),
    "nested stats cell": (
        lambda h, a: _view(h)["stats_rows"][0].__setitem__("layer", [0]),
        "view: stats_rows[] must be",
    ),
    "compressed_texts of ints": (_set(_view, "compressed_texts", [1, 2]), "view: compressed_texts must be"),
    "array name a list": (_set(_view, "kept", {"array": ["x"]}), "view: array"),
    "sequence tokens short": (_set(_sequence, "tokens", ["a"]), "view: sequence.tokens must be"),
    "controls group size 7": (
        lambda h, a: h["extra"]["config"].__setitem__("group_size", 7),
        "extra: config: group size",
    ),
    "budget_note number": (_set(_view, "budget_note", 5), "view: budget_note must be"),
    "steps first_compared past the end": (_set(_steps, "first_compared", 10**6), "first_compared must be"),
    "extra a list": (lambda h, a: h.__setitem__("extra", []), "extra must be an object"),
}


@pytest.fixture(scope="module")
def victim(saved, model_dirs, tmp_path_factory):
    """A window that opened the good session (view, pin, controls on screen) and now meets forged files."""
    _, path = saved
    window = _window(str(model_dirs["llama"]), tmp_path_factory.mktemp("victim") / "settings.json")
    window.session_files.open(path)
    wait_until(lambda: window.session_files.last_opened == str(path))
    QApplication.processEvents()
    assert window.pinning.pin_state is not None
    yield window
    _close(window)


def _refused(window, out, fragment: str) -> None:
    """Open `out` and check the dialog, the engine's session, the pin and the screen."""
    before, session, pin = _screen(window), _engine_session(window), window.pinning.pin_state
    window.last_error = None
    window.session_files.open(out)
    wait_until(lambda: window.last_error is not None)
    assert str(out) in window.last_error and fragment in window.last_error, window.last_error
    assert window._message_box is not None and window._message_box.text() == window.last_error
    assert _engine_session(window) is session and window.pinning.pin_state is pin
    QApplication.processEvents()
    _assert_same_screen(before, _screen(window))


@pytest.mark.parametrize("case", list(FORGED))
def test_a_forged_session_file_is_refused_whole(saved, victim, tmp_path, case):
    _, path = saved
    edit, fragment = FORGED[case]
    out = tmp_path / "forged.kvlens"
    _forge(path, out, edit)
    _refused(victim, out, fragment)
    if not fragment.startswith("NaN"):
        assert EDITED in victim.last_error  # the fix


def test_the_original_opens_after_the_forgeries(saved, victim):
    """The refusals left nothing behind that stops a good file."""
    _, path = saved
    victim.session_files.last_opened = None
    victim.session_files.open(path)
    wait_until(lambda: victim.session_files.last_opened == str(path))
    assert victim.pinning.pin_state is not None and victim.statsTable.rows()


def test_a_hub_id_is_never_fetched_from_a_session_file(saved, victim, tmp_path):
    _, path = saved
    out = tmp_path / "hub.kvlens"
    model = {"spec": "someorg/somemodel", "name": "somemodel", "fingerprint": "0" * 64}
    _forge(path, out, lambda h, a: h.__setitem__("model", model))
    _refused(victim, out, "'someorg/somemodel', which is not a model folder on this computer")
    assert "never downloads" in victim.last_error and "load that model" in victim.last_error


def test_a_folder_holding_another_model_is_refused_before_any_load(saved, victim, model_dirs, tmp_path):
    """The folder's weights are garbage: a load would fail with mlx-lm's message, not the fingerprint's."""
    _, path = saved
    folder = tmp_path / "other"
    shutil.copytree(model_dirs["qwen3"], folder)
    (folder / "model.safetensors").write_bytes(b"not weights")
    out = tmp_path / "other.kvlens"
    model = {"spec": str(folder), "name": "llama", "fingerprint": "f" * 64}
    _forge(path, out, lambda h, a: h.__setitem__("model", model))
    _refused(victim, out, f"{folder} now holds another model")
    assert victim.model_info.name == "llama"
