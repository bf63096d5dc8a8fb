"""Layers stored whole (sliding window, SSM state) are drawn grey and hatched, with their label, in every view."""

from __future__ import annotations

import numpy as np
import pytest

from app.widgets.heatmap import (
    EVICTED_RGBA,
    FIXED_HATCH_RGBA,
    FIXED_KEPT_RGBA,
    KEPT_RGBA,
    VIEW_SCORES,
    RetentionHeatmap,
)

LAYERS, HEADS, T, WINDOW = 3, 2, 12, 4
LABEL = f"sliding window {WINDOW}: not compressible"


@pytest.fixture
def heatmap(qtbot):
    widget = RetentionHeatmap()
    widget.resize(800, 400)
    qtbot.addWidget(widget)
    widget.show()
    rng = np.random.default_rng(0)
    kept = rng.random((LAYERS * HEADS, T)) < 0.5
    kept[2:4] = False
    kept[2:4, -WINDOW:] = True  # layer 1 is a sliding-window layer: its steady state holds the last WINDOW
    labels = [f"L{layer} h{h}" for layer in range(LAYERS) for h in range(HEADS)]
    scores = rng.random((LAYERS * HEADS, T)).astype(np.float32)
    widget.set_data(kept, labels, [f"t{i}" for i in range(T)], scores, None, LAYERS, HEADS, {1: LABEL})
    return widget, kept


def _colours(image: np.ndarray) -> set[tuple[int, ...]]:
    return {tuple(int(c) for c in px) for px in image.reshape(-1, 4)}


@pytest.mark.parametrize("view", [None, VIEW_SCORES])
def test_fixed_layer_rows_are_grey_and_hatched_with_a_label(heatmap, view):
    widget, kept = heatmap
    if view is not None:
        widget.set_view(view)
    image = widget.image_rgba()
    fixed = image[2:4]
    assert (fixed[:, -WINDOW:] == FIXED_KEPT_RGBA).all()
    assert _colours(fixed[:, :-WINDOW]) == set(FIXED_HATCH_RGBA)  # both stripe shades: hatched
    others = np.concatenate([image[:2], image[4:]])
    assert not (_colours(others) & {FIXED_KEPT_RGBA, *FIXED_HATCH_RGBA})
    if view is None:
        np.testing.assert_array_equal((image[:2] == KEPT_RGBA).all(axis=-1), kept[:2])
        assert (image[:2][~kept[:2]] == EVICTED_RGBA).all()
    assert widget.fixed_labels() == [LABEL]
    assert LABEL in widget.info_at(2, T - 1) and "in the window" in widget.info_at(2, T - 1)
    assert "outside the window" in widget.info_at(3, 0)


def test_one_layer_view_and_new_data_without_fixed_layers(heatmap):
    widget, kept = heatmap
    widget.set_layer(1)
    assert list(widget.fixed_rows()) == [0, 1] and widget.fixed_labels() == [LABEL]
    widget.set_layer(0)
    assert widget.fixed_rows().size == 0 and widget.fixed_labels() == []
    widget.set_layer(None)
    widget.set_data(
        kept, [f"r{i}" for i in range(LAYERS * HEADS)], [f"t{i}" for i in range(T)], None, None, 3, 2
    )
    assert widget.fixed_labels() == [] and not (_colours(widget.image_rgba()) & set(FIXED_HATCH_RGBA))
