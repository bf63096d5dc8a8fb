"""Heatmap binning: one image column per screen pixel (kept fraction, mean score), exact cells when zoomed in."""

from __future__ import annotations

import numpy as np
import pytest

from app.widgets.heatmap import _FRACTION_LUT, VIEW_SCORES, RetentionHeatmap
from app.widgets.heatmap_bins import bin_counts, bin_masked_means, bin_means, bin_width, fraction_index


def _naive_bins(values: np.ndarray, width: int) -> list[np.ndarray]:
    return [values[:, i : i + width] for i in range(0, values.shape[1], width)]


@pytest.mark.parametrize("width", [1, 3, 7, 300])
def test_bins_equal_a_loop_over_bins(width):
    rng = np.random.default_rng(width)
    mask = rng.random((5, 1001)) < 0.4
    values = rng.random((5, 1001)).astype(np.float32)
    counts = bin_counts(mask, width)
    expected = np.stack([b.sum(axis=1) for b in _naive_bins(mask, width)], axis=1)
    np.testing.assert_array_equal(counts, expected)
    means = np.stack([b.mean(axis=1) for b in _naive_bins(values, width)], axis=1)
    np.testing.assert_allclose(bin_means(values, width), means, rtol=1e-5)
    masked = np.stack(
        [
            np.array([v[m].mean() if m.any() else np.nan for v, m in zip(bv, bm, strict=True)])
            for bv, bm in zip(_naive_bins(values, width), _naive_bins(mask, width), strict=True)
        ],
        axis=1,
    )
    np.testing.assert_allclose(bin_masked_means(values, mask, counts, width), masked, rtol=1e-5)
    sizes = np.array([b.shape[1] for b in _naive_bins(mask, width)])
    np.testing.assert_array_equal(fraction_index(counts, width, 1001), np.rint(255 * expected / sizes))
    assert bin_width(1001, 100) == 11 and bin_width(10, 100) == 1


@pytest.fixture
def widget(qtbot):
    w = RetentionHeatmap()
    w.resize(700, 500)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    rng = np.random.default_rng(0)
    rows, length = 36 * 2, 4096
    kept = rng.random((rows, length)) < np.linspace(0.05, 0.95, rows)[:, None]
    scores = rng.random((rows, length)).astype(np.float32)
    labels = [f"L{i // 2} h{i % 2}" for i in range(rows)]
    w.set_data(kept, labels, [f"t{i}" for i in range(length)], scores, None, 36, 2)
    return w, kept, scores


def test_zoomed_out_each_pixel_is_the_kept_fraction_of_its_bin(widget):
    w, kept, _ = widget
    first, end, width = w.displayed_window()
    shown = w.image.image
    assert (first, end) == (0, kept.shape[1]) and width > 1
    assert shown.shape[1] <= w.plot.vb.width() * w.devicePixelRatioF() + 1
    fractions = np.stack([b.mean(axis=1) for b in _naive_bins(kept, width)], axis=1)
    np.testing.assert_array_equal(shown, _FRACTION_LUT[np.rint(255 * fractions).astype(int)])


def test_zoomed_in_cells_are_exact_and_the_scores_view_bins_means(widget):
    w, kept, scores = widget
    w.plot.setXRange(1000, 1040, padding=0)
    first, end, width = w.displayed_window()
    assert width == 1 and first <= 1000 and end >= 1040
    np.testing.assert_array_equal(w.image.image, w.image_rgba()[:, first:end])
    assert w.image.mapRectToParent(w.image.boundingRect()).left() == first
    assert f"position {first + 3}" in w.info_at(0, first + 3)
    w.plot.setXRange(0, kept.shape[1], padding=0)
    w.set_view(VIEW_SCORES)
    _, _, width = w.displayed_window()
    means = np.stack([b.mean(axis=1) for b in _naive_bins(scores, width)], axis=1)
    lo, hi = float(w.colorBar.levels()[0]), float(w.colorBar.levels()[1])
    assert lo == pytest.approx(means.min(), rel=1e-5) and hi == pytest.approx(means.max(), rel=1e-5)
