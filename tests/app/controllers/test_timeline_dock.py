"""The Timeline dock in the real window: a decode under a policy from the GUI equals a Session decoding the same
in the test thread; scrubbing to a step puts exactly that step's compression into the main heatmap; hover says
the token and when it left; the CSV holds the run's rows; Esc keeps what was generated."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.widgets.heatmap import KEPT_RGBA
from kvcore.engine.decoding import DecodingPolicy, decode_with_policy
from kvcore.engine.session import CompressionConfig
from kvcore.engine.timeline import TIMELINE_COLUMNS, timeline
from tests.app.waiting import wait_until
from tests.app.windows import window_and_reference

TOKENS = 4
DECODED = 40
BUDGET, INTERVAL = 16, 8


@pytest.fixture(scope="module")
def ctx(qapp, model_dirs, tmp_path_factory):
    window, ref = window_and_reference(model_dirs, tmp_path_factory.mktemp("settings") / "s.json", TOKENS)
    window.resize(1280, 800)
    yield window, ref
    window.close()
    QApplication.processEvents()


@pytest.fixture(scope="module")
def decoded(ctx):
    """The GUI's run (streaming_llm from the Compression panel's cache) and the reference Session's."""
    window, ref = ctx
    panel = window.timelinePanel
    panel.set_policy("streaming_llm", BUDGET, INTERVAL, DECODED)
    QTest.mouseClick(panel.runButton, Qt.MouseButton.LeftButton)
    assert window.timeline.running and window.timelineDock.isVisible()
    wait_until(lambda: not window.timeline.running, timeout=120)
    cfg = CompressionConfig.from_dict(window.controls.config())
    state = ref.compress(cfg)
    run = decode_with_policy(ref, state, DecodingPolicy("streaming_llm", BUDGET, INTERVAL), DECODED)
    start = [None if i in state.not_compressible else h for i, h in enumerate(ref.kept_positions(state))]
    return panel.view(), run, timeline(run, ref.n_compressible(cfg.schedule), start)


def _heatmap_kept(window) -> np.ndarray:
    window.heatmap.set_layer(None)
    return (window.heatmap.image_rgba()[..., :3] == np.array(KEPT_RGBA[:3])).all(axis=-1)


def test_decode_from_the_gui_fills_the_timeline(ctx, decoded):
    window, ref = ctx
    view, run, tl = decoded
    assert view is not None and not view.cancelled
    assert view.token_texts == ref.token_texts([*ref.prompt_ids, *run.tokens])
    assert view.compression_steps == [c.step for c in run.compressions] and len(run.compressions) >= 3
    np.testing.assert_array_equal(view.timeline.evicted_at, tl.evicted_at)
    steps = view.token_steps
    assert len(steps.kl) == DECODED and steps.tokens == ref.token_texts(run.tokens)
    panel = window.timelinePanel
    assert panel.image.image is not None and panel.image.image.shape[:2] == (tl.n_steps + 1, tl.n_positions)
    assert panel.step() == tl.n_steps, "the slider starts on the last step"
    assert "streaming_llm · budget 16 · every 8" in panel.summaryLabel.text()


def test_scrubbing_puts_each_compression_into_the_heatmap(ctx, decoded):
    window, _ = ctx
    view, run, _ = decoded
    slider = window.timelinePanel.stepSlider
    slider.setFocus()
    QTest.keyClick(slider, Qt.Key.Key_Home)
    by_step = {c.step: c for c in run.compressions}
    for _ in range(len(run.compressions) + 1):
        step = slider.value()
        if step in by_step:
            c = by_step[step]
            expected = np.zeros((view.n_layers * view.n_kv_heads, view.timeline.n_start + step), bool)
            for layer, heads in enumerate(c.kept):
                for h, kept in enumerate(heads):
                    expected[layer * view.n_kv_heads + h, kept] = True
            assert (_heatmap_kept(window) == expected).all(), step
            assert window.timelinePanel.stepLabel.text().endswith("· evicted")
            assert window.heatmap.title.startswith(f"The cache at decode step {step} of")
        QTest.keyClick(slider, Qt.Key.Key_PageUp)  # one eviction interval on
    assert slider.value() == view.timeline.n_steps
    QTest.keyClick(slider, Qt.Key.Key_Left)
    assert slider.value() == view.timeline.n_steps - 1, "the arrow keys step the slider, not the session"
    assert _heatmap_kept(window).shape[1] == view.timeline.n_start + slider.value()


def test_hover_says_the_token_and_when_it_left(ctx, decoded):
    window, ref = ctx
    view, run, tl = decoded
    panel = window.timelinePanel
    panel.set_head(0, 1)
    QApplication.processEvents()
    last = run.compressions[-1]
    pos = next(
        p for p in range(tl.n_positions) if tl.evicted_at[0, 1, p] == last.step
    )  # left at the last eviction
    step = last.step - 1
    vb = panel.plot.vb
    scene = vb.mapViewToScene(QPointF(pos + 0.5, step + 0.5))
    QTest.mouseMove(panel.graphics.viewport(), panel.graphics.mapFromScene(scene))
    QApplication.processEvents()
    text = panel.graphics.toolTip()
    token = view.token_texts[pos]
    where = f"prompt {pos}" if pos < len(ref.prompt_ids) else f"generated {pos - len(ref.prompt_ids)}"
    assert text == panel.info_at(step, pos)
    assert f"Step {step}" in text and f"position {pos} ({where})" in text
    assert f"L0 h1: held; evicted at step {last.step}" in text
    assert token.strip()[:5] in text
    share = tl.share_held()[step, pos]
    assert f"held by {100 * share:.0f} %" in text


def test_csv_export_holds_the_runs_rows(ctx, decoded, tmp_path):
    window, _ = ctx
    _, _, tl = decoded
    path = tmp_path / "timeline.csv"
    assert window.timeline.export_csv(path)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == TIMELINE_COLUMNS
    assert [tuple(int(v) for v in r) for r in rows[1:]] == tl.rows()
    png = tmp_path / "timeline.png"
    assert window.timeline.export_image(png, 600) and png.read_bytes()[:4] == b"\x89PNG"


def test_escape_keeps_what_was_generated(ctx):
    window, ref = ctx
    panel = window.timelinePanel
    panel.set_policy("knorm", 12, 4, 1500)
    panel.prefillCheck.setChecked(False)  # the full cache, under the Compression panel's schedule
    window.controls.set_config({"schedule": "mlx-lm"})
    QTest.mouseClick(panel.runButton, Qt.MouseButton.LeftButton)
    wait_until(lambda: "of 1,500 tokens" in panel.summaryLabel.text(), timeout=60)
    window.actions_.cancel.trigger()  # Esc
    wait_until(lambda: not window.timeline.running, timeout=60)
    view = panel.view()
    assert view.cancelled and view.policy["method"] == "knorm"
    assert 0 < view.n_generated < 1500 and len(view.token_steps.kl) == view.n_generated
    assert "cancelled" in panel.summaryLabel.text()
    assert view.prefill_config is None and view.timeline.n_start == len(ref.prompt_ids) - 1
    assert view.timeline.start_held.all()
    window.controls.set_config({"schedule": "paper"})


def test_8192_tokens_past_the_context_need_the_box_and_escape_keeps_them(ctx):
    window, ref = ctx
    panel = window.timelinePanel
    panel.set_policy("streaming_llm", 12, 4, 8192)
    assert panel.tokens() == 8192 > ref.info.max_context  # the tiny model's context is 4,096
    assert not panel.beyond_context()
    QTest.mouseClick(panel.runButton, Qt.MouseButton.LeftButton)
    wait_until(lambda: not window.timeline.running, timeout=60)
    assert "Beyond trained context" in window.last_error and "generate at most" in window.last_error
    panel.beyondCheck.setChecked(True)
    QTest.mouseClick(panel.runButton, Qt.MouseButton.LeftButton)
    wait_until(lambda: "of 8,192 tokens" in panel.summaryLabel.text(), timeout=60)
    window.actions_.cancel.trigger()  # Esc
    wait_until(lambda: not window.timeline.running, timeout=60)
    view = panel.view()
    assert view.cancelled and 0 < view.n_generated < 8192 and len(view.token_steps.kl) == view.n_generated
    assert not view.beyond_context  # cut short well inside the context
    panel.beyondCheck.setChecked(False)


def test_opening_a_session_clears_the_timeline(ctx, tmp_path):
    window, _ = ctx
    panel = window.timelinePanel
    assert panel.has_data()
    path = tmp_path / "s.kvlens"
    window.session_files.save(path)
    wait_until(lambda: window.session_files.last_saved is not None)
    window.session_files.open(path)
    wait_until(lambda: not panel.has_data())
    assert "a session was opened" in panel.summaryLabel.text()
