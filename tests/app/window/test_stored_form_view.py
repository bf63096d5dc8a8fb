"""The Stored form dock in the real window (issue 38): ThinK's kept key channels per (layer, kv-head) equal a Session's
in the test thread and their bytes are the memory the cache really lost; merging's targets are drawn as arcs and
named on hover, in the dock and in the heatmap; a method that does neither says so in one line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.engine.stored_view import ChannelView
from app.engine.view_checks import check_view
from app.engine.view_store import pack, unpack
from app.widgets.channel_map import NO_CHANNELS
from app.widgets.heatmap import KEPT_RGBA
from app.widgets.merge_map import NO_MERGES
from app.window.main_window import MainWindow
from kvcore.engine.session import CompressionConfig, Session
from tests.app.waiting import wait_until
from tests.app.windows import shown_after

PROMPT = "def main(argv): return sum(x * x for x in argv) The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def ctx(qapp, model_dirs, tmp_path_factory):
    model = str(model_dirs["llama"])
    window = MainWindow(
        model=model, settings_path=tmp_path_factory.mktemp("s") / "s.json", continuation_tokens=2
    )
    window.resize(1280, 800)
    window.show()
    ref = Session.load(model)
    ref.prefill(PROMPT, n_tokens=2, chat_template=False)
    wait_until(lambda: window.model_info is not None)
    window.sessionPanel.chatTemplateCheck.setChecked(False)
    window.prefill(PROMPT)
    wait_until(lambda: window.displayed_ids)
    yield window, ref
    window.close()
    QApplication.processEvents()


def _show(window, method: str, ratio: float = 0.5):
    shown_after(
        window,
        lambda: window.controls.set_config({**window.controls.config(), "method": method, "ratio": ratio}),
    )
    return CompressionConfig.from_dict(window.controls.config())


def _hover(graphics, plot, x: float, y: float) -> str:
    scene = plot.vb.mapViewToScene(QPointF(x, y))
    QTest.mouseMove(graphics.viewport(), graphics.mapFromScene(scene))
    QApplication.processEvents()
    return graphics.toolTip()


def test_think_shows_each_heads_kept_channels_and_the_bytes_they_save(ctx):
    window, ref = ctx
    assert window.storedDock.visibleRegion().isEmpty(), "snapkv: the continuations stay in front"
    cfg = _show(window, "think")
    panel = window.storedPanel
    assert not window.storedDock.visibleRegion().isEmpty(), "picking think brings its channels to the front"
    assert panel.currentWidget() is panel.channelMap
    view = panel.channelMap.view()
    state = ref.compress(cfg)
    plain = ref.compress(CompressionConfig("snapkv", cfg.ratio, schedule=cfg.schedule))
    head_dim = ref.info.head_dim
    n_heads = state.kept.shape[1]
    for layer, channels in enumerate(Session.kept_channels(state)):
        want = np.zeros((n_heads, head_dim), bool)
        np.put_along_axis(want, channels.astype(np.int64), True, axis=1)
        np.testing.assert_array_equal(view.kept[layer * n_heads : (layer + 1) * n_heads], want)
    assert view.kept.sum(axis=1).tolist() == [head_dim // 2] * view.kept.shape[0], "ratio 0.5 prunes half"
    assert int(view.bytes_saved.sum()) == plain.bytes_compressed - state.bytes_compressed, "the memory lost"
    drawn = panel.channelMap.image.image
    assert drawn.shape[:2] == view.kept.shape
    assert ((drawn[..., :3] == KEPT_RGBA[:3]).all(axis=-1) == view.kept).all()
    assert f"of {head_dim} key channels" in panel.channelMap.noteLabel.text()
    row, channel = 3, int(np.flatnonzero(~view.kept[3])[0])
    text = _hover(panel.channelMap.graphics, panel.channelMap.plot, channel + 0.5, row + 0.5)
    assert text == panel.channelMap.info_at(row, channel)
    assert f"Layer 1 · kv-head 1 · key channel {channel} · pruned" in text
    assert (
        f"stores {head_dim // 2} of {head_dim} channels for its {int(view.rows_stored[row])} kept rows"
        in text
    )
    assert panel.mergeMap.noteLabel.text() == NO_MERGES and panel.mergeMap.graphics.isHidden()
    kept_at = int(np.flatnonzero(window.heatmap._kept[row, : window.heatmap.boundary_column])[0])
    heat = window.heatmap.info_at(row, kept_at)
    assert f"kept · key stored in {head_dim // 2} of {head_dim} channels (ThinK)" in heat
    QApplication.processEvents()
    scroll = window.controlsDock.widget()
    assert not scroll.horizontalScrollBar().isVisible(), "key_channel_compression_ratio wraps, the panel fits"
    assert window.controls.methodParameters.label("key_channel_compression_ratio").wordWrap()


def test_merging_draws_where_each_evicted_position_went(ctx):
    window, ref = ctx
    cfg = _show(window, "merging")
    panel = window.storedPanel
    assert panel.currentWidget() is panel.mergeMap
    targets = Session.merge_targets(ref.compress(cfg))
    merges = panel.mergeMap
    layer = merges.layer()
    want = [
        (h, int(p), int(targets[layer][h, p])) for h, p in zip(*np.nonzero(targets[layer] >= 0), strict=True)
    ]
    assert want and merges.arc_pairs() == want
    x, _ = merges.arcs.getData()
    assert np.isnan(x).sum() == len(want), "one arc an evicted position"
    head, source, target = want[0]
    tokens = window.heatmap._tokens
    text = _hover(merges.graphics, merges.plot, source + 0.5, head + 0.5)
    assert text == merges.info_at(head, source) and f"merged into position {target}" in text
    assert f"position {source} '" in text
    merges.set_matrix(True)
    assert merges.point_count() == len(want), "one point a merge"
    matrix = _hover(merges.graphics, merges.plot, source + 0.5, target + 0.5)
    assert f"position {source} '" in matrix and f"merged into position {target}" in matrix
    merges.set_matrix(False)
    kept_text = merges.info_at(head, target)
    assert "kept; holds" in kept_text and str(source) in kept_text
    window.heatmap.set_layer(None)
    row = layer * ref.info.n_kv_heads + head
    heat = _hover(window.heatmap.graphics, window.heatmap.plot, source + 0.5, row + 0.5)
    assert heat == window.heatmap.info_at(row, source)
    assert "evicted · merged into position" in heat and f"position {target} (token '" in heat
    assert tokens[target].strip()[:3] in heat
    assert panel.channelMap.noteLabel.text() == NO_CHANNELS and panel.channelMap.graphics.isHidden()


def test_a_method_that_keeps_the_stored_form_says_so(ctx):
    window, _ = ctx
    _show(window, "snapkv")
    panel = window.storedPanel
    assert panel.channelMap.noteLabel.text() == NO_CHANNELS and panel.channelMap.view() is None
    assert panel.mergeMap.noteLabel.text() == NO_MERGES and not panel.mergeMap.arc_pairs()
    evicted = np.argwhere(~window.heatmap._kept[:, : window.heatmap.boundary_column])[0]
    assert "merged" not in window.heatmap.info_at(*evicted)


def test_a_saved_session_shows_the_same_stored_form(ctx, tmp_path):
    window, _ = ctx
    _show(window, "think")
    panel = window.storedPanel
    channels, arcs = panel.channelMap.view(), panel.mergeMap.arc_pairs()
    window.session_files.save(tmp_path / "s.kvlens")
    wait_until(lambda: window.session_files.last_saved is not None)
    _show(window, "snapkv")
    assert panel.channelMap.view() is None and not panel.mergeMap.arc_pairs()
    before = len(window.displayed_ids)
    window.session_files.open(tmp_path / "s.kvlens")
    wait_until(lambda: window.session_files.last_opened is not None and len(window.displayed_ids) > before)
    assert panel.mergeMap.arc_pairs() == arcs == []
    np.testing.assert_array_equal(panel.channelMap.view().kept, channels.kept)
    np.testing.assert_array_equal(panel.channelMap.view().bytes_saved, channels.bytes_saved)


def test_merge_targets_are_kept_in_a_saved_view_and_forged_ones_refused(ctx):
    window, _ = ctx
    _show(window, "merging")
    view = window.pinning.current
    np.testing.assert_array_equal(unpack(*pack(view)).merge_targets, view.merge_targets)
    evicted = np.argwhere(~view.kept[:, : view.n_prompt_positions])[0]
    forged = view.merge_targets.copy()
    forged[evicted[0], 0] = evicted[1]  # a value "merged into" a position the head evicted
    with pytest.raises(ValueError, match="view: merge_targets must be the kept position"):
        check_view(dataclasses.replace(view, merge_targets=forged))
    with pytest.raises(ValueError, match=r"view: merge_targets must be -1 or a prompt position"):
        check_view(dataclasses.replace(view, merge_targets=view.merge_targets + 10_000))
    channels = ChannelView(np.ones((3, 4), bool), np.zeros(3, np.int64), np.zeros(3, np.int64), [0])
    with pytest.raises(ValueError, match="view: key_channels.kept must be a bool array"):
        check_view(dataclasses.replace(view, merge_targets=None, key_channels=channels))


def test_each_view_exports_png_and_svg_or_says_it_is_empty(ctx, tmp_path):
    window, _ = ctx
    exports = window.stored_form
    _show(window, "merging")
    assert exports.export_merges(tmp_path / "m.svg") and (tmp_path / "m.svg").read_text().startswith("<?xml")
    assert not exports.export_channels(tmp_path / "c.png")
    assert "the key-channel map is empty" in window.last_error and not (tmp_path / "c.png").exists()
    window._message_box.close()
    _show(window, "think")
    assert exports.export_channels(tmp_path / "c.png", width=400)
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
