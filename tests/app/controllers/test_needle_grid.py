"""The Needle grid dock in the real window on the demo model: 3 depths × 2 lengths × 2 methods, every cell equal
to `kvlens probe` on the same family and seed (run in the test thread); clicking a cell loads its prompt."""

from __future__ import annotations

import csv
import sys

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.window.main_window import MainWindow
from kvcore.cli.main import main as cli_main
from kvcore.probes import HELDOUT_FAMILIES
from kvcore.probes.scoring import PROBE_COLUMNS
from kvcore.resources import demo_model_dir
from tests.app.waiting import wait_until

FAMILY = HELDOUT_FAMILIES[-1]
SEED = 3
DEPTHS, LENGTHS = "0.1,0.5,0.9", "96,192"
METHODS = ["snapkv", "streaming_llm"]
RATIO = "0.5"


def _model(model_dirs) -> str:
    demo = demo_model_dir()
    return str(demo) if (demo / "config.json").is_file() else str(model_dirs["llama"])


@pytest.fixture(scope="module")
def ctx(qapp, model_dirs, tmp_path_factory):
    model = _model(model_dirs)
    window = MainWindow(model=model, settings_path=tmp_path_factory.mktemp("settings") / "s.json")
    window.resize(1400, 1000)
    window.show()
    wait_until(lambda: window.model_info is not None)
    panel = window.needlePanel
    QTest.keyClick(
        window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    )
    assert window.needleDock.isVisible()
    panel.set_family(FAMILY)
    panel.seedSpin.setValue(SEED)
    panel.depthsEdit.setText(DEPTHS)
    panel.lengthsEdit.setText(LENGTHS)
    panel.set_methods(METHODS)
    panel.ratiosEdit.setText(RATIO)
    panel.bitsEdit.setText("16")
    QTest.mouseClick(panel.runButton, Qt.MouseButton.LeftButton)
    wait_until(lambda: not window.needles.running, timeout=300)
    yield window, model
    window.close()
    QApplication.processEvents()


def test_every_cell_equals_kvlens_probe_on_the_same_seed(ctx, tmp_path):
    window, model = ctx
    out = tmp_path / "probe.csv"
    argv = ["probe", "--model", model, "--families", FAMILY, "--seed", str(SEED), "--seeds", "1"]
    argv += ["--depths", DEPTHS, "--lengths", LENGTHS, "--methods", ",".join(METHODS), "--ratios", RATIO]
    assert cli_main([*argv, "--csv", str(out)]) == 0
    with open(out, newline="") as f:
        expected = list(csv.DictReader(f))
    assert len(expected) == 6 * 3  # 6 probes × (dense + 2 methods)
    state = window.needlePanel.grid.state()
    assert state.shape == (3, 2, 3) and (state >= 0).all()
    depths, lengths = [0.1, 0.5, 0.9], [96, 192]
    panels = ["dense", *(c.method for c in window.needles.configs)]  # the dock's method order
    assert sorted(panels[1:]) == sorted(METHODS)
    for row in expected:
        li, di = lengths.index(int(row["n_tokens"])), depths.index(float(row["depth"]))
        assert state[panels.index(row["method"]), li, di] == int(row["recalled"]), row
    shown = tmp_path / "grid.csv"
    assert window.needles.export_csv(shown)
    with open(shown, newline="") as f:
        mine = list(csv.DictReader(f))
    assert list(mine[0]) == list(PROBE_COLUMNS)
    key = ("family", "seed", "depth", "n_tokens", "method", "retention_ratio", "recalled", "continuation")
    assert sorted(tuple(r[k] for k in key) for r in mine) == sorted(
        tuple(r[k] for k in key) for r in expected
    )
    for suffix in ("png", "svg"):
        assert window.needles.export_image(tmp_path / f"g.{suffix}")


def test_panel_titles_name_the_dense_cache_dtype_for_unquantized_configurations(ctx):
    """The grid ran bits 16: each method's panel says 'snapkv 50 % · float32' (MLX's CPU), not '16-bit'."""
    window, _ = ctx
    dtype = window.model_info.cache_dtype
    if sys.platform != "darwin":
        assert dtype == "float32"
    titles = window.needlePanel.grid.titles()
    assert titles == ["dense", *(f"{c.method} 50 % · {dtype}" for c in window.needles.configs)]


def test_clicking_a_cell_opens_its_prompt_and_cache(ctx):
    window, _ = ctx
    view = window.needlePanel.grid
    li, di = 1, 2  # 192 tokens, depth 0.9, in the first method's panel
    cell = window.needles.cell(li, di)
    QTest.mouseClick(
        view.graphics.viewport(), Qt.MouseButton.LeftButton, pos=view.cell_widget_position(1, li, di)
    )
    wait_until(lambda: window.sessionPanel.promptEdit.toPlainText() == cell.probe.prompt)
    wait_until(lambda: window.displayed_ids and window.status.busyLabel.text() == "", timeout=120)
    config = window.controls.config()
    assert (config["method"], config["ratio"]) == (window.needles.configs[0].method, 0.5)
    tokens = window.sessionPanel.generatedView.starts
    assert len(tokens) > cell.rows[0]["prompt_tokens"]  # the prompt was prefilled and continued
    assert np.asarray(window.heatmap.image_rgba()).size > 0


def test_the_dock_starts_on_the_grid_the_demo_model_recalls_whole_dense(qapp):
    """kvcore's test_the_default_grid_is_recalled_whole_by_the_dense_cache_on_the_demo_model checks these values."""
    from app.widgets.needle_panel import NeedlePanel
    from kvcore.defaults import DEFAULT_PROBE_FAMILY, DEFAULT_PROBE_SEED

    panel = NeedlePanel()
    assert panel.family() == DEFAULT_PROBE_FAMILY and panel.seedSpin.value() == DEFAULT_PROBE_SEED
    assert (panel.depthsEdit.text(), panel.lengthsEdit.text()) == ("0.1,0.5,0.9", "800,1600")
