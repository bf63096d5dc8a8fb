"""Pin and diff in the real window on the demo model: the Diff view's counts, the Jaccard column and the CSV
equal set arithmetic on kept masks that a Session computes in the test thread; the pin survives slider moves
and a new prefill clears it."""

from __future__ import annotations

import csv
import sys

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.engine.view_model import rows_of
from app.widgets.heatmap import DIFF_RGBA, VIEW_DIFF, VIEW_KEPT
from kvcore.engine.session import CompressionConfig, Session
from kvcore.measure.export import STATS_COLUMNS
from tests.app.waiting import wait_until
from tests.app.windows import CODE_PROMPT, shown_after, window_and_reference

TOKENS = 4
PINNED = {"method": "snapkv", "ratio": 0.4, "bits": None}
CURRENT = {"method": "h2o", "ratio": 0.3, "bits": 4, "group_size": 32}


@pytest.fixture(scope="module")
def ctx(qapp, model_dirs, tmp_path_factory):
    window, ref = window_and_reference(model_dirs, tmp_path_factory.mktemp("settings") / "s.json", TOKENS)
    yield window, ref
    window.close()
    QApplication.processEvents()


def _kept(ref: Session, window, config: dict) -> np.ndarray:
    """[L, H, T] kept mask of the window's full configuration with `config` applied, from the test's Session."""
    return ref.compress(CompressionConfig.from_dict({**window.controls.config(), **config})).kept


def _pairs(mask: np.ndarray) -> set[tuple[int, int]]:
    return {(int(h), int(t)) for h, t in zip(*np.nonzero(mask), strict=True)}


def _press(window, key: Qt.Key, modifiers: Qt.KeyboardModifier) -> None:
    window.heatmap.graphics.setFocus()
    QTest.keyClick(window.heatmap.graphics, key, modifiers)


def test_diff_view_jaccard_and_csv_equal_set_arithmetic_on_the_two_kept_masks(ctx, tmp_path):
    window, ref = ctx
    ctrl, shift = Qt.KeyboardModifier.ControlModifier, Qt.KeyboardModifier.ShiftModifier
    shown_after(window, lambda: window.controls.set_config(PINNED))
    assert window.pinning.pinAction.shortcut().toString() == "Ctrl+P"
    _press(window, Qt.Key.Key_P, ctrl)
    assert window.pinning.pin_state is not None and window.heatmap.view() == VIEW_DIFF
    assert (window.heatmap.diff_counts()[:, 1:3] == 0).all(), "pinned against itself: no one-sided cells"

    shown_after(window, lambda: window.controls.set_config(CURRENT))
    pinned, current = _kept(ref, window, PINNED), _kept(ref, window, CURRENT)
    L, H, T = current.shape
    counts = window.heatmap.diff_counts()
    assert counts.shape == (L * H, 4)
    for layer in range(L):
        for head in range(H):
            a = set(np.flatnonzero(current[layer, head]).tolist())
            b = set(np.flatnonzero(pinned[layer, head]).tolist())
            neither = set(range(T)) - a - b
            assert counts[layer * H + head].tolist() == [len(neither), len(b - a), len(a - b), len(a & b)]
    assert counts[:, 1].sum() > 0 and counts[:, 2].sum() > 0, "the two methods should keep different sets"

    image = window.heatmap.image_rgba()
    a, b = rows_of(current), rows_of(pinned)
    palette = np.array(DIFF_RGBA, dtype=np.uint8)
    expected = palette[np.where(a & b, 3, np.where(a, 2, np.where(b, 1, 0)))]
    np.testing.assert_array_equal(image[:, :T], expected)
    assert (image[:, T:] == DIFF_RGBA[3]).all()  # the always-stored tail is in both
    n, p, c, both = counts[H + 1]
    assert window.heatmap.info_at(H + 1, 0).endswith(
        f"row: both {both}, only current {c}, only pinned {p}, neither {n}"
    )

    rows = window.statsTable.rows()
    for row in rows:
        sa, sb = _pairs(current[row["layer"]]), _pairs(pinned[row["layer"]])
        assert row["jaccard_vs_pinned"] == pytest.approx(len(sa & sb) / len(sa | sb))
        assert (row["pinned_method"], row["pinned_retention_ratio"]) == ("snapkv", 0.4)
    out = tmp_path / "stats.csv"
    assert window.export_csv(out)
    with out.open(newline="", encoding="utf-8") as f:
        parsed = list(csv.DictReader(f))
    assert list(parsed[0]) == list(window.statsTable.columns()) and "jaccard_vs_pinned" in parsed[0]
    for got, row in zip(parsed, rows, strict=True):
        assert float(got["jaccard_vs_pinned"]) == pytest.approx(row["jaccard_vs_pinned"], rel=1e-12)
        assert got["pinned_method"] == "snapkv" and got["pinned_key_bits"] == "16"

    shown_after(window, lambda: window.controls.retentionSlider.setValue(70))  # the pin survives
    moved = _kept(ref, window, {})
    assert window.pinning.pin_state is not None
    assert window.heatmap.diff_counts()[:, 3].tolist() == (rows_of(moved) & b).sum(axis=1).tolist()

    _press(window, Qt.Key.Key_P, ctrl | shift)  # unpin
    assert window.pinning.pin_state is None and window.heatmap.view() == VIEW_KEPT
    assert window.statsTable.columns() == STATS_COLUMNS


def test_a_new_prefill_clears_the_pin_and_says_so(ctx):
    window, _ = ctx
    assert window.pinning.pin()
    window.prefill(CODE_PROMPT + "self.width")
    rid = window.engine.latest_id("compress")
    wait_until(lambda: window.displayed_ids[-1] == rid)
    assert window.pinning.pin_state is None and window.heatmap.pinned() is None
    message = window.statusBar().currentMessage()
    assert "cleared" in message and "new prefill" in message
    assert window.statsTable.columns() == STATS_COLUMNS
    assert window.pinning.pinAction.isEnabled() and not window.pinning.unpinAction.isEnabled()


def test_the_pin_label_and_the_metrics_name_the_dense_cache_dtype(ctx):
    """An unquantized pin says 'float32' (MLX's CPU keeps the dense cache in float32), not '16-bit'."""
    window, _ = ctx
    dtype = window.model_info.cache_dtype
    if sys.platform != "darwin":
        assert dtype == "float32"
    shown_after(window, lambda: window.controls.set_config(PINNED))
    assert window.pinning.pin()
    assert window.pinning.pin_state.label == f"snapkv 40 % · {dtype}"
    assert f"Pinned snapkv 40 % · {dtype} as B" in window.statusBar().currentMessage()
    assert f"Bytes dense ({dtype}):" in window.metricsPanel.text()
    assert f"of the {dtype} cache" in window.metricsPanel.tooltip("compression_ratio")
    window.pinning.unpin()
    assert window.pinning.pin_state is None
