"""RetentionHeatmap: pixels follow the data, hover describes the cell, export writes real files."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtTest import QTest

from app.widgets.heatmap import (
    DIFF_RGBA,
    EVICTED_RGBA,
    KEPT_RGBA,
    VIEW_DIFF,
    VIEW_QUANT,
    VIEW_SCORES,
    VIEWS,
    RetentionHeatmap,
)

LAYERS, HEADS, T = 4, 2, 16


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    kept = rng.random((LAYERS * HEADS, T)) < 0.5
    kept[:, -1] = True
    kept[0, 0] = False
    labels = [f"L{layer} H{h}" for layer in range(LAYERS) for h in range(HEADS)]
    tokens = [f"tok{i}" for i in range(T)]
    scores = rng.random((LAYERS * HEADS, T)).astype(np.float32)
    quant = np.where(kept, rng.random((LAYERS * HEADS, T)), np.nan).astype(np.float32)
    return kept, labels, tokens, scores, quant


@pytest.fixture
def heatmap(qtbot):
    widget = RetentionHeatmap()
    widget.resize(800, 500)
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    kept, labels, tokens, scores, quant = _data()
    widget.set_data(kept, labels, tokens, scores, quant, LAYERS, HEADS)
    qtbot.wait(30)  # let the axes size themselves to the new labels before mapping mouse positions
    return widget


def test_object_name_and_kept_pixels(heatmap):
    kept = _data()[0]
    img = heatmap.image_rgba()
    assert heatmap.objectName() == "heatmapView"
    assert img.shape == (LAYERS * HEADS, T, 4)
    assert (img[kept] == KEPT_RGBA).all()
    assert (img[~kept] == EVICTED_RGBA).all()


def test_pixels_change_when_retention_changes(heatmap):
    kept, labels, tokens, scores, quant = _data()
    before = heatmap.image_rgba()
    kept2 = kept.copy()
    kept2[3, 5] = not kept2[3, 5]
    heatmap.set_data(kept2, labels, tokens, scores, quant, LAYERS, HEADS)
    after = heatmap.image_rgba()
    changed = np.argwhere((before != after).any(axis=-1))
    assert changed.tolist() == [[3, 5]]


def test_scores_view_shows_colour_bar_and_dims_evicted(heatmap):
    kept, *_ = _data()
    heatmap.set_view(VIEW_SCORES)
    img = heatmap.image_rgba().astype(int)
    assert heatmap.colorBar.isVisible() and not heatmap.legendLabel.isVisible()
    brightness = img[..., :3].sum(axis=-1)
    assert brightness[kept].mean() > 2 * brightness[~kept].mean()
    lo, hi = heatmap.colorBar.levels()
    assert lo == pytest.approx(float(_data()[3].min())) and hi == pytest.approx(float(_data()[3].max()))


def test_quant_view_and_unavailable_views(heatmap):
    kept, labels, tokens, *_ = _data()
    heatmap.set_view(VIEW_QUANT)
    img = heatmap.image_rgba()
    assert (img[~kept] == EVICTED_RGBA).all()
    assert len(np.unique(img[kept].reshape(-1, 4), axis=0)) > 5
    heatmap.set_data(kept, labels, tokens, None, None, LAYERS, HEADS)
    assert heatmap.view() == "Kept"
    item = heatmap.viewCombo.model().item(2)
    assert not item.isEnabled() and "not quantized" in item.toolTip()


def test_layer_selection_shows_only_its_heads(heatmap):
    kept = _data()[0]
    heatmap.set_layer(2)
    img = heatmap.image_rgba()
    assert img.shape == (HEADS, T, 4)
    assert (img[kept[4:6]] == KEPT_RGBA).all()
    assert heatmap.info_at(1, 3).startswith("Layer 2 · kv-head 1 · position 3")
    heatmap.set_layer(None)
    assert heatmap.image_rgba().shape[0] == LAYERS * HEADS


def test_hover_emits_info_and_sets_tooltip(heatmap, qtbot):
    vb = heatmap.plot.vb
    view = heatmap.graphics
    point = view.mapFromScene(vb.mapViewToScene(QPointF(0.5, 0.5)))
    with qtbot.waitSignal(heatmap.hoverInfo, timeout=2000) as blocker:
        QTest.mouseMove(view.viewport(), point)
    text = blocker.args[0]
    assert (
        text
        == "Layer 0 · kv-head 0 · position 0 · token 'tok0' · score " + f"{_data()[3][0, 0]:.4g} · evicted"
    )
    assert view.toolTip() == text
    point = view.mapFromScene(vb.mapViewToScene(QPointF(T - 0.5, 2.5)))
    qtbot.wait(50)  # pyqtgraph drops mouse moves that follow each other too closely
    with qtbot.waitSignal(heatmap.hoverInfo, timeout=2000) as blocker:
        QTest.mouseMove(view.viewport(), point)
    assert blocker.args[0].startswith("Layer 1 · kv-head 0 · position 15 · token 'tok15'")
    assert blocker.args[0].endswith("kept")


def test_highlight_position_marker(heatmap):
    heatmap.highlight_position(7)
    assert heatmap.marker.isVisible() and heatmap.marker.value() == 7.5
    heatmap.highlight_position(None)
    assert not heatmap.marker.isVisible()


def test_x_axis_shows_tokens_when_zoomed_in(heatmap, qtbot):
    axis = heatmap._x_axis
    width = heatmap.plot.vb.width()
    heatmap.plot.setXRange(0, 4, padding=0)
    values = axis.tickValues(0, 4, width)
    assert axis.tickStrings(values[0][1], 1, 1) == ["tok0", "tok1", "tok2", "tok3"]
    values = axis.tickValues(0, 4000, width)
    assert all(s.isdigit() for s in axis.tickStrings(values[0][1], 1, values[0][0]))


def test_rejects_mismatched_shapes(heatmap):
    kept, labels, tokens, scores, quant = _data()
    with pytest.raises(ValueError):
        heatmap.set_data(kept, labels[:-1], tokens, scores, quant, LAYERS, HEADS)
    with pytest.raises(ValueError):
        heatmap.set_data(kept, labels, tokens, scores[:, :-1], quant, LAYERS, HEADS)


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml")])
def test_export_image(heatmap, tmp_path, suffix, magic):
    heatmap.set_view(VIEW_SCORES)
    path = tmp_path / f"heatmap{suffix}"
    heatmap.export_image(path)
    data = path.read_bytes()
    assert data.startswith(magic) and len(data) > 500
    if suffix == ".svg":
        assert b"<svg" in data and b"<image" in data
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_export_rejects_unknown_suffix_and_unwritable_folder(heatmap, tmp_path):
    with pytest.raises(ValueError):
        heatmap.export_image(tmp_path / "x.bmp")
    with pytest.raises(OSError):
        heatmap.export_image(tmp_path / "missing" / "x.png")


def test_large_cache_image_shape(qtbot):
    widget = RetentionHeatmap()
    qtbot.addWidget(widget)
    rows, length = 32 * 8, 8192
    rng = np.random.default_rng(1)
    kept = rng.random((rows, length)) < 0.25
    labels = [f"L{layer} H{h}" for layer in range(32) for h in range(8)]
    scores = rng.random((rows, length), dtype=np.float32)
    widget.set_data(kept, labels, [str(i) for i in range(length)], scores, None, 32, 8)
    assert widget.image_rgba().shape == (rows, length, 4)
    widget.set_view(VIEW_SCORES)
    assert widget.image_rgba().shape == (rows, length, 4)
    first, end, width = widget.displayed_window()  # on screen: one image column per pixel
    assert (first, end) == (0, length) and widget.image.image.shape == (rows, -(-length // width), 4)


def test_packed_lut_equals_row_indexing():
    from app.widgets.heatmap import _apply

    rng = np.random.default_rng(3)
    lut = rng.integers(0, 256, size=(257, 4), dtype=np.uint8)
    idx = rng.integers(0, 257, size=(7, 33)).astype(np.uint16)
    np.testing.assert_array_equal(_apply(lut, idx), lut[idx])


def _pinned_mask(seed: int = 7) -> np.ndarray:
    """A second kept mask over the first T - 2 columns (the last two play the always-stored tail)."""
    return np.random.default_rng(seed).random((LAYERS * HEADS, T - 2)) < 0.5


def test_diff_view_needs_a_pin_and_colours_each_class(heatmap):
    item = heatmap.viewCombo.model().item(VIEWS.index(VIEW_DIFF))
    assert not item.isEnabled() and "Pin" in item.toolTip()
    kept, pinned = _data()[0], _pinned_mask()
    heatmap.set_pinned(pinned, "snapkv 25 %")
    assert item.isEnabled()
    heatmap.set_view(VIEW_DIFF)
    img = heatmap.image_rgba()
    prompt = kept[:, : T - 2]
    for cls, mask in (
        (3, prompt & pinned),
        (2, prompt & ~pinned),
        (1, ~prompt & pinned),
        (0, ~prompt & ~pinned),
    ):
        assert mask.any(), "the random masks should give every class"
        assert (img[:, : T - 2][mask] == DIFF_RGBA[cls]).all(), cls
    assert (img[:, T - 2 :][kept[:, T - 2 :]] == DIFF_RGBA[3]).all()  # the tail is stored by both
    legend = heatmap.legendLabel.text()
    assert "only current" in legend and "only pinned" in legend and "snapkv 25 %" in legend
    assert f"both {int((prompt & pinned).sum()):,}" in legend

    heatmap.set_pinned(None)
    assert heatmap.view() == "Kept" and not item.isEnabled()
    assert (heatmap.image_rgba()[kept] == KEPT_RGBA).all()


def test_diff_counts_and_hover_equal_set_differences(heatmap):
    kept, pinned = _data()[0], _pinned_mask()
    heatmap.set_pinned(pinned, "B")
    heatmap.set_view(VIEW_DIFF)
    counts = heatmap.diff_counts()
    for row in range(LAYERS * HEADS):
        a = set(np.flatnonzero(kept[row, : T - 2]).tolist())
        b = set(np.flatnonzero(pinned[row]).tolist())
        neither = set(range(T - 2)) - a - b
        assert counts[row].tolist() == [len(neither), len(b - a), len(a - b), len(a & b)]
    text = heatmap.info_at(3, 1)
    cls = ("neither", "only pinned", "only current", "both")[2 * int(kept[3, 1]) + int(pinned[3, 1])]
    n, p, c, both = counts[3]
    assert text.endswith(f"{cls} · row: both {both}, only current {c}, only pinned {p}, neither {n}")
    assert heatmap.info_at(3, T - 1).split(" · ")[-2] == "both (always stored)"
    heatmap.set_layer(1)  # rows of layer 1 only: the pinned rows follow
    text = heatmap.info_at(0, 1)
    assert text.startswith("Layer 1 · kv-head 0")
    n, p, c, both = counts[HEADS]
    assert text.endswith(f"row: both {both}, only current {c}, only pinned {p}, neither {n}")


def test_a_pin_of_another_shape_is_not_diffed(heatmap):
    heatmap.set_pinned(np.ones((3, 4), dtype=bool), "other model")
    assert heatmap.diff_counts().shape == (0, 4)
    assert not heatmap.viewCombo.model().item(VIEWS.index(VIEW_DIFF)).isEnabled()


def test_diff_covers_the_longer_compressible_range_of_the_two(heatmap):
    kept, pinned = _data()[0], _pinned_mask()  # pinned covers T - 2 positions, the current one T - 1
    heatmap.set_pinned(pinned, "B")
    heatmap.set_view(VIEW_DIFF)
    heatmap.set_boundary(T - 1)
    wide = np.concatenate([pinned, np.ones((LAYERS * HEADS, 1), bool)], axis=1)  # B stored position T - 2
    counts = heatmap.diff_counts()
    for row in range(LAYERS * HEADS):
        a, b = kept[row, : T - 1], wide[row]
        assert counts[row].tolist() == [(~a & ~b).sum(), (~a & b).sum(), (a & ~b).sum(), (a & b).sum()]
    assert f"both {int((kept[:, : T - 1] & wide).sum()):,}" in heatmap.legendLabel.text()


def test_a_narrow_view_of_many_positions_paints(qtbot):
    """Narrower than half its columns, pyqtgraph downsamples the RGBA image to floats; without explicit
    levels its paint() raised "levels argument is required" (seen aborting the suite)."""
    widget = RetentionHeatmap()
    widget.resize(160, 120)
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    rows, length = 4, 2000
    kept = np.random.default_rng(2).random((rows, length)) < 0.5
    widget.set_data(
        kept, [f"L{r} H0" for r in range(rows)], [str(i) for i in range(length)], None, None, rows, 1
    )
    frame = widget.grab().toImage()
    assert frame.width() > 0
    assert widget.image_rgba().shape == (rows, length, 4)
    assert widget.image.image.shape[1] <= widget.plot.vb.width() * widget.devicePixelRatioF() + 1


def test_png_export_is_1600_px_wide_by_default_or_the_width_asked_and_the_view_is_restored(heatmap, tmp_path):
    from PySide6.QtGui import QImage

    from app.widgets.plot_export import DEFAULT_EXPORT_WIDTH

    shown = heatmap.graphics.ci.geometry()
    heatmap.export_image(tmp_path / "default.png")
    heatmap.export_image(tmp_path / "narrow.png", width=900)
    assert QImage(str(tmp_path / "default.png")).width() == DEFAULT_EXPORT_WIDTH >= 1600
    assert QImage(str(tmp_path / "narrow.png")).width() == 900
    assert heatmap.graphics.ci.geometry() == shown, "the on-screen layout is put back after the export"
