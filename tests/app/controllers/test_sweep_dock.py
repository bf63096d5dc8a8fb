"""The Sweep dock in the real window on the demo model: a 3-method × 4-ratio sweep streams 12 points that equal a
Session computing the same configurations in the test thread; the frontier is the brute-force non-dominated
subset; clicking a point applies it; Cancel after the 3rd point keeps 3 and the engine stays usable."""

from __future__ import annotations

import csv
import sys

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.engine.view_model import rows_of
from app.widgets.frontier import point_text
from app.widgets.heatmap import render_kept
from kvcore.engine.session import CompressionConfig, Session
from kvcore.measure.export import SWEEP_COLUMNS
from kvcore.measure.frontier import METRICS, metric_value
from tests.app.waiting import wait_until
from tests.app.windows import shown_after, window_and_reference
from tests.kvcore.measure.test_frontier import brute_force

TOKENS = 4
METHODS = ["h2o", "snapkv", "streaming_llm"]  # as the method list orders them
RATIOS = "0.1,0.25,0.5,0.75"
TIMINGS = ("recompress_ms", "regenerate_ms")


@pytest.fixture(scope="module")
def ctx(qapp, model_dirs, tmp_path_factory):
    window, ref = window_and_reference(model_dirs, tmp_path_factory.mktemp("settings") / "s.json", TOKENS)
    window.resize(1400, 1000)
    yield window, ref
    window.close()
    QApplication.processEvents()


def _run(window, methods=METHODS, ratios=RATIOS, bits="16") -> None:
    panel = window.sweepPanel
    QTest.keyClick(
        window, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    )
    assert window.sweepDock.isVisible()
    panel.set_methods(methods)
    panel.ratiosEdit.setText(ratios)
    panel.bitsEdit.setText(bits)
    QTest.mouseClick(panel.runButton, Qt.MouseButton.LeftButton)


def _reference(ref: Session, cfg: CompressionConfig):
    state = ref.compress(cfg)
    return state, ref.regenerate(state)


@pytest.fixture(scope="module")
def swept(ctx):
    window, _ = ctx
    streamed = []
    window.engine.partialResult.connect(
        lambda r: streamed.append((len(window.sweeping.points()), window.sweeping.running))
    )
    _run(window)
    wait_until(lambda: not window.sweeping.running, timeout=300)
    return streamed


def test_twelve_points_equal_a_session_computing_the_same_configs(ctx, swept):
    window, ref = ctx
    points = window.sweeping.points()
    assert len(points) == 12
    assert swept == [(n, True) for n in range(1, 13)], (
        "each point was drawn while the sweep ran, one at a time"
    )
    assert [(p.config.method, p.config.ratio) for p in points] == [
        (m, r) for m in METHODS for r in (0.1, 0.25, 0.5, 0.75)
    ]
    xs, ys = window.sweepPanel.frontier.xy()
    for i, point in enumerate(points):
        state, regen = _reference(ref, point.config)
        expected = {k: v for k, v in regen.metrics.items() if k not in ("kl_per_step", *TIMINGS)}
        assert {k: v for k, v in point.metrics.items() if k not in TIMINGS} == expected, point.config
        assert point.bytes_compressed == state.bytes_compressed and point.bytes_dense == state.bytes_dense
        assert xs[i] == pytest.approx(100 * state.bytes_compressed / state.bytes_dense)
        assert ys[i] == regen.metrics["kl_mean"]  # KL mean is the default y
    assert window.sweepPanel.progressBar.value() == 12
    assert "12 points" in window.sweepPanel.estimateLabel.text()


@pytest.mark.parametrize("metric", ["kl_mean", "agreement", "first_divergence"])
def test_frontier_is_the_brute_force_non_dominated_subset(ctx, swept, metric):
    window, ref = ctx
    plot = window.sweepPanel.frontier
    plot.set_metric(metric)
    xs, ys = [], []
    for point in window.sweeping.points():
        state, regen = _reference(ref, point.config)
        xs.append(100 * state.bytes_compressed / state.bytes_dense)
        ys.append(metric_value(regen.metrics, metric))
    expected = brute_force(xs, ys, METRICS[metric].higher_is_better)
    assert set(plot.frontier()) == expected and expected
    points = window.sweeping.points()
    assert plot.frontier_texts() == [point_text(points[i], plot.baseline) for i in plot.frontier()]
    assert plot.plot.getAxis("left").logMode == METRICS[metric].log
    plot.set_metric("kl_mean")


def test_hover_names_the_point_and_click_applies_its_configuration(ctx, swept):
    window, ref = ctx
    plot = window.sweepPanel.frontier
    current = window.controls.config()
    points = window.sweeping.points()
    spots = [plot.widget_position(i) for i in range(len(points))]

    def clearance(i: int) -> int:
        """Pixels to the nearest other point: hover picks the nearest, so the one clicked must stand apart."""
        return min((spots[i] - spots[j]).manhattanLength() for j in range(len(points)) if j != i)

    index = max(
        (
            i
            for i, p in enumerate(points)
            if (p.config.method, p.config.ratio) != (current["method"], current["ratio"])
            and p.config.method == "h2o"
        ),
        key=clearance,
    )
    assert clearance(index) >= 6, "every h2o point sits on another one"
    point = points[index]
    QTest.mouseMove(plot.view.viewport(), plot.widget_position(index))
    wait_until(lambda: plot.view.toolTip() == point_text(point, plot.baseline))

    def click() -> None:
        QTest.mouseClick(plot.view.viewport(), Qt.MouseButton.LeftButton, pos=plot.widget_position(index))

    shown_after(window, click)
    config = window.controls.config()
    assert CompressionConfig.from_dict(config) == point.config
    state, regen = _reference(ref, point.config)
    kept = rows_of(state.kept)
    tail = len(ref.prompt_ids) + len(ref.dense_tokens) - kept.shape[1]
    expected = render_kept(np.concatenate([kept, np.ones((kept.shape[0], tail), bool)], axis=1))
    np.testing.assert_array_equal(window.heatmap.image_rgba(), expected)
    assert window.comparison.compressedTextView.toPlainText() == "".join(ref.token_texts(regen.tokens))
    assert window.metricsPanel.value_text("kl_mean") != "", "statistics switched too"


def test_exports_png_svg_and_the_csv_of_kvlens_sweep(ctx, swept, tmp_path):
    window, ref = ctx
    sweeping = window.sweeping
    for suffix in ("png", "svg"):
        assert sweeping.export_image(tmp_path / f"f.{suffix}")
        assert (tmp_path / f"f.{suffix}").stat().st_size > 0
    assert sweeping.export_csv(tmp_path / "s.csv")
    with open(tmp_path / "s.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(SWEEP_COLUMNS)
    info = window.model_info
    assert len(rows) == 12 * info.n_layers * info.n_kv_heads
    for point in sweeping.points():
        mine = [
            r
            for r in rows
            if (r["method"], float(r["retention_ratio"])) == (point.config.method, point.config.ratio)
        ]
        assert {float(r["kl_mean"]) for r in mine} == {point.metrics["kl_mean"]}
        assert sum(int(r["bytes_compressed"]) for r in mine) == point.bytes_compressed


def test_bad_grid_says_why_and_runs_nothing(ctx, swept):
    window, _ = ctx
    before = window.sweeping.points()
    _run(window, ratios="0.125,0.5")
    assert "finer than" in window.last_error and not window.sweeping.running
    _run(window, methods=[])
    assert "no method is ticked" in window.last_error
    assert window.sweeping.points() == before


def test_cancel_after_the_third_point_keeps_three_and_the_engine_stays_usable(ctx, swept):
    window, ref = ctx
    seen = []

    def on_engine_thread(result) -> None:  # runs where the point is published, before the 4th starts
        seen.append(result)
        if len(seen) == 3:
            window.sweeping.cancel()

    window.engine.partialResult.connect(on_engine_thread, Qt.ConnectionType.DirectConnection)
    try:
        _run(window, bits="4,16")
        wait_until(lambda: not window.sweeping.running, timeout=300)
    finally:
        window.engine.partialResult.disconnect(on_engine_thread)
    assert len(window.sweeping.points()) == 3 and len(seen) == 3
    assert "Cancelled after 3 of 24" in window.sweepPanel.estimateLabel.text()
    assert window.sweepPanel.runButton.isEnabled()
    config = {"method": "snapkv", "ratio": 0.33, "bits": None}
    shown_after(window, lambda: window.controls.set_config(config))
    state = ref.compress(CompressionConfig.from_dict(window.controls.config()))
    assert int(window.heatmap.image_rgba().shape[0]) == rows_of(state.kept).shape[0]
    assert window.statsTable.rows()[0]["tokens_kept"] == int(state.kept[0, 0].sum())


def test_unquantized_points_name_the_models_cache_dtype_not_16_bit(ctx, swept):
    """Every unquantized point's label says the dense cache's element type (float32 on MLX's CPU)."""
    window, _ = ctx
    dtype = window.model_info.cache_dtype
    if sys.platform != "darwin":
        assert dtype == "float32", "MLX's CPU backend keeps the dense cache in float32"
    plot = window.sweepPanel.frontier
    assert plot.baseline == dtype
    dense = [p for p in window.sweeping.points() if p.config.widths == (16, 16)]
    assert dense, "the sweeps ran bits 16"
    for point in dense:
        assert f"{100 * point.config.ratio:.0f} % · {dtype} · " in point_text(point, plot.baseline)
    assert plot.frontier_texts() and not any("16-bit" in t for t in plot.frontier_texts())
    assert plot.plot.getAxis("bottom").labelText == f"compressed KV cache (% of dense {dtype})"
