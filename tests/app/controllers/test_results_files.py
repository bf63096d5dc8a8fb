"""File ▸ Open Results…: a results file that `kvlens sweep --prompts` wrote on the demo model (2 prompts × 2
configurations) shows one point per configuration at its means, error bars whose ends are the file's interval,
the Pareto frontier of the means and a hover with configuration, mean, interval and prompt count; a click only
names the configuration; bad files leave a dialog and the previous plot, session and controls."""

from __future__ import annotations

import csv
import json
import math
import os
import time

import numpy as np
import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QKeySequence
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.__main__ import main as kvlens
from app.controllers.results_files import OPEN_RESULTS_SHORTCUT
from app.widgets.config_text import config_label
from app.window.main_window import MainWindow
from kvcore.measure.export import SET_SUMMARY_COLUMNS
from kvcore.measure.frontier import METRICS
from kvcore.resources import demo_model_dir
from kvcore.sets.summary import summary_paths
from tests.app.waiting import wait_until
from tests.kvcore.measure.test_frontier import brute_force

PROMPTS = [
    {"id": "code", "prompt": "def area(w, h):\n    return w * h\n\nprint(area(3, 4))\n", "answer": " 12"},
    {"id": "story", "prompt": "The cat sat on the mat. The dog sat on the log. The cat", "answer": " sat"},
]
GRID = ["--methods", "streaming_llm", "--ratios", "0.25,0.75", "--tokens", "3"]


@pytest.fixture(scope="module")
def results(tmp_path_factory, qapp):
    """(per-row CSV, summary CSV, summary JSON, --plot PNG) of a real prompt-set run on the demo model."""
    root = tmp_path_factory.mktemp("results")
    prompts = root / "set.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out, png = root / "set.csv", root / "set.png"
    argv = ["sweep", "--model", str(demo_model_dir()), "--prompts", str(prompts), *GRID, "--csv", str(out)]
    assert kvlens([*argv, "--plot", str(png), "--metric", "agreement"]) == 0
    return (out, *summary_paths(out), png)


@pytest.fixture(scope="module")
def window(qapp, tmp_path_factory):
    settings = tmp_path_factory.mktemp("s") / "settings.json"
    w = MainWindow(model=str(demo_model_dir()), settings_path=settings, continuation_tokens=4)
    w.resize(1400, 1000)
    w.show()
    wait_until(lambda: w.model_info is not None)
    yield w
    w.close()
    QApplication.processEvents()


def _open(window, path) -> bool:
    """File ▸ Open Results on `path`, waiting while the engine thread reads it: True when it was drawn."""
    window.last_error = None
    if window.results_files.open(path) is None:
        return False
    wait_until(lambda: window.results_files.opening is None)
    return window.last_error is None


def _summary(path) -> list[dict[str, float | str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _bars(plot) -> dict[str, np.ndarray]:
    opts = plot.errorBars.opts
    return {k: np.asarray(opts[k], dtype=float) for k in ("x", "y", "top", "bottom")}


def test_the_summary_run_writes_the_plot_and_every_metric_with_an_interval(results):
    out, summary_csv, _, png = results
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = _summary(summary_csv)
    assert list(rows[0]) == list(SET_SUMMARY_COLUMNS) and len(rows) == 2
    for row in rows:
        assert row["prompts"] == "2"
        low, mean, high = (float(row[f"compression_ratio_{p}"]) for p in ("low", "mean", "high"))
        assert 0 < low <= mean <= high < 1


def test_open_results_draws_each_configuration_with_its_interval_and_the_pareto_front(window, results):
    _, summary_csv, _, _ = results
    rows = _summary(summary_csv)
    assert _open(window, summary_csv), window.last_error
    plot = window.sweepPanel.frontier
    assert window.sweepDock.isVisible() and plot.showing_results()
    points = plot.points()
    assert [config_label(p.config.to_dict()) for p in points] == [
        config_label({"method": r["method"], "ratio": float(r["retention_ratio"]), "bits": 16}) for r in rows
    ]
    xs = [100 * float(r["compression_ratio_mean"]) for r in rows]
    assert not plot.xCombo.isEnabled()
    for key, name in (("agreement", "agreement"), ("kl_mean", "kl"), ("nll_delta", "nll_delta")):
        plot.set_metric(key)
        mean, low, high = (np.array([float(r[f"{name}_{p}"]) for r in rows]) for p in ("mean", "low", "high"))
        x, y = plot.xy()
        np.testing.assert_allclose(x, xs)
        np.testing.assert_array_equal(y, mean)
        bars = _bars(plot)
        np.testing.assert_allclose(bars["x"], xs)
        if METRICS[key].log:  # the bar item is in view coordinates: log10 of the values
            np.testing.assert_allclose(10 ** (bars["y"] + bars["top"]), high, rtol=1e-12)
            np.testing.assert_allclose(10 ** (bars["y"] - bars["bottom"]), low, rtol=1e-12)
        else:
            np.testing.assert_allclose(bars["top"], high - mean, atol=1e-15)
            np.testing.assert_allclose(bars["bottom"], mean - low, atol=1e-15)
            np.testing.assert_allclose(bars["top"] + bars["bottom"], high - low, atol=1e-15)
        expected = brute_force(xs, mean.tolist(), METRICS[key].higher_is_better)
        assert set(plot.frontier()) == expected and expected
        texts = plot.frontier_texts()
        assert len(texts) == len(expected)
        for i, text in zip(plot.frontier(), texts, strict=True):
            assert text.startswith(config_label(points[i].config.to_dict()))
            assert f"[{low[i]:.4g}, {high[i]:.4g}]" in text
    assert "needle_recall" in [plot.metricCombo.itemData(i) for i in range(plot.metricCombo.count())]
    assert all("(n < 10: min–max of few prompts)" in t for t in plot.frontier_texts())  # 2 prompts
    assert "first_divergence" not in [plot.metricCombo.itemData(i) for i in range(plot.metricCombo.count())]


def test_hover_says_configuration_mean_interval_and_prompts_and_a_click_applies_nothing(window, results):
    _, summary_csv, _, _ = results
    assert _open(window, summary_csv)
    plot = window.sweepPanel.frontier
    plot.set_metric("agreement")
    row = _summary(summary_csv)[1]
    point = plot.points()[1]
    QTest.qWait(50)  # the dock lays out and the view takes its auto range
    QTest.mouseMove(plot.view.viewport(), plot.widget_position(1))
    wait_until(lambda: plot.view.toolTip() != "")
    tip = plot.view.toolTip()
    mean, low, high = (float(row[f"agreement_{p}"]) for p in ("mean", "low", "high"))
    assert config_label(point.config.to_dict()) in tip and "2 prompts" in tip
    assert tip.endswith(" · (n < 10: min–max of few prompts)")
    assert f"agreement {mean:.4g} [{low:.4g}, {high:.4g}]" in tip
    assert window.statusBar().currentMessage() == tip
    before, compress_ids = window.controls.config(), list(window.displayed_ids)
    QTest.mouseClick(plot.view.viewport(), Qt.MouseButton.LeftButton, pos=plot.widget_position(1))
    QTest.qWait(50)
    message = window.statusBar().currentMessage()
    assert message.startswith(tip) and "nothing was applied" in message
    assert window.controls.config() == before and window.displayed_ids == compress_ids


def test_a_new_prefill_keeps_the_results_they_belong_to_no_prefill(window, results):
    _, summary_csv, _, _ = results
    assert _open(window, summary_csv)
    points = window.sweepPanel.frontier.points()
    drawn = len(window.displayed_ids)
    window.sessionPanel.promptEdit.setPlainText("def f(x):\n    return x + 1\n")
    window.prefill()
    wait_until(lambda: len(window.displayed_ids) > drawn)
    assert window.sweepPanel.frontier.points() == points and window.sweeping.results_path == summary_csv


def test_per_row_csv_and_json_summary_open_to_the_same_points(window, results):
    out, summary_csv, summary_json, _ = results
    assert _open(window, summary_csv)
    plot = window.sweepPanel.frontier
    want = [(p.config, p.prompts, p.metrics, p.intervals, p.memory) for p in plot.points()]
    for path in (summary_json, out):
        assert _open(window, path), window.last_error
        got = [(p.config, p.prompts, p.metrics, p.intervals, p.memory) for p in plot.points()]
        assert got == want, path


def test_the_file_menu_action_has_its_own_shortcut_and_recent_results_reopen(window, results):
    _, summary_csv, summary_json, _ = results
    action = window.actions_.open_results
    file_menu = window.menuBar().actions()[0].menu()
    assert action in file_menu.actions() and action.shortcut() == QKeySequence(OPEN_RESULTS_SHORTCUT)
    others = [
        a.shortcut()
        for a in window.findChildren(type(action))
        if a is not action and not a.shortcut().isEmpty()
    ]
    assert action.shortcut() not in others
    assert _open(window, summary_json) and _open(window, summary_csv)
    recent = window.actions_.recent_results.actions()
    assert [a.text() for a in recent][:2] == [str(summary_csv.resolve()), str(summary_json.resolve())]
    window.sweepPanel.frontier.clear()
    recent[1].trigger()  # File ▸ Open Recent Results ▸ the JSON
    wait_until(lambda: window.results_files.opening is None)
    assert window.sweeping.results_path == summary_json.resolve()
    assert len(window.sweepPanel.frontier.points()) == 2


def _bad(results, tmp_path) -> dict[str, tuple[bytes, str]]:
    _, summary_csv, summary_json, _ = results
    text = summary_csv.read_text()
    header, first, *_ = text.splitlines()
    cells = first.split(",")
    cells[header.split(",").index("kl_mean")] = "abc"
    no_memory = "\n".join(
        ",".join(
            c for i, c in enumerate(line.split(",")) if i < header.split(",").index("compression_ratio_mean")
        )
        for line in text.splitlines()
    )
    return {
        "not a results file": (b"name,score\nalice,3\n", "neither a 'prompts' column"),
        "missing column": (no_memory.encode(), "lacks the columns compression_ratio_mean"),
        "empty": (b"", "is empty"),
        "header only": ((header + "\n").encode(), "no rows"),
        "wrong type": ("\n".join([header, ",".join(cells)]).encode(), "kl_mean is 'abc', not a number"),
        "binary junk": (os.urandom(64) + b"\x00\xff", "not a text file"),
        "json without configurations": (b'{"confidence": 0.95}', '"configurations" list'),
        "cut json": (summary_json.read_bytes()[:-40], "not valid JSON"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "not a results file",
        "missing column",
        "empty",
        "header only",
        "wrong type",
        "binary junk",
        "json without configurations",
        "cut json",
    ],
)
def test_bad_results_files_show_a_dialog_and_keep_the_plot(window, results, tmp_path, case):
    _, summary_csv, _, _ = results
    assert _open(window, summary_csv)
    plot = window.sweepPanel.frontier
    plot.set_metric("agreement")
    before_points, before_bars = plot.points(), _bars(plot)
    before_config, session = window.controls.config(), window.engine._state.get("session")
    data, fragment = _bad(results, tmp_path)[case]
    bad = tmp_path / ("bad.json" if "json" in case else "bad.csv")
    bad.write_bytes(data)
    window.last_error = None
    assert not _open(window, bad)
    assert window.last_error is not None and str(bad) in window.last_error and fragment in window.last_error
    assert "kvlens sweep --prompts" in window.last_error  # the fix: which file to open instead
    assert window._message_box is not None and window._message_box.text() == window.last_error
    assert plot.points() == before_points and plot.metric_key() == "agreement"
    for k, v in _bars(plot).items():
        np.testing.assert_array_equal(v, before_bars[k])
    assert window.controls.config() == before_config and window.engine._state.get("session") is session
    assert window.sweeping.results_path == summary_csv
    assert math.isfinite(plot.xy()[1][0])
    window._message_box.close()


@pytest.mark.parametrize(
    "writer, plot, extra, message",
    [
        ("app", "f.png", ["--metric", "first_divergence"], "a prompt-set summary has no first_divergence"),
        ("app", "f.txt", [], "write a .png or .svg"),
        ("kvcore", "f.png", [], "draws with Qt"),
    ],
)
def test_prompt_set_plot_refusals_exit_2_before_the_model_loads(
    tmp_path, capsys, writer, plot, extra, message
):
    from kvcore.cli.main import main as kvcore_main

    prompts = tmp_path / "set.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    argv = ["sweep", "--model", str(tmp_path / "no-such-model"), "--prompts", str(prompts), *GRID]
    assert (kvlens if writer == "app" else kvcore_main)([*argv, "--plot", str(tmp_path / plot), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlens: error:") and message in err and "\n" not in err
    assert list(tmp_path.iterdir()) == [prompts]


def test_a_100k_row_results_file_opens_while_the_window_keeps_running(window, results, tmp_path):
    """Issue 42 item 16: read and bootstrapped on the GUI thread, such a file froze the window for 16 s."""
    out, summary_csv, _, _ = results
    header, *rows = out.read_text().splitlines()
    prompt = header.split(",").index("prompt")
    big = tmp_path / "big.csv"
    lines = [header]
    copies = -(-100_000 // len(rows))  # each copy of the run is under other prompt ids
    for i in range(copies):
        for row in rows:
            cells = row.split(",")
            cells[prompt] = f"{cells[prompt]}-{i}"
            lines.append(",".join(cells))
    big.write_text("\n".join(lines) + "\n")
    assert len(lines) - 1 >= 100_000
    ticks: list[float] = []
    said: set[str] = set()  # what the status bar said while the file was read

    def tick() -> None:
        ticks.append(time.monotonic())
        said.add(window.status.busyLabel.text())

    timer = QTimer()
    timer.timeout.connect(tick)
    timer.start(20)
    window.last_error = None
    try:
        start = time.monotonic()
        rid = window.results_files.open(big)
        returned = time.monotonic() - start
        assert rid is not None and returned < 0.2  # the GUI thread only submits the job
        wait_until(lambda: window.results_files.opening is None, timeout=300)
        took = time.monotonic() - start
    finally:
        timer.stop()
    assert window.last_error is None and window.sweeping.results_path == big
    assert "Reading and summarising big.csv…" in said  # the progress
    assert [p.prompts for p in window.sweepPanel.frontier.points()] == [len(PROMPTS) * copies] * 2
    gaps = np.diff([start, *ticks])
    # the window kept running: no pause of a second (the GUI-thread read froze it for 16 s); the reader thread
    # shares the GIL, so on a loaded machine the 20 ms timer fires less often, hence a tenth of its rate
    assert len(ticks) >= took / 0.02 / 10 and gaps.max() < 1.0, (took, len(ticks), gaps.max())


def test_a_sweep_csv_opens_as_one_prompt_points_without_bars(window, tmp_path):
    """The Sweep dock's Export CSV (`kvlens sweep --csv`'s columns, no prompt column) is a one-prompt result."""
    out = tmp_path / "sweep.csv"
    argv = ["sweep", "--model", str(demo_model_dir()), "-p", PROMPTS[0]["prompt"], *GRID, "--csv", str(out)]
    assert kvlens(argv) == 0
    assert _open(window, out), window.last_error
    plot = window.sweepPanel.frontier
    plot.set_metric("agreement")
    rows = {r["retention_ratio"]: r for r in reversed(_summary(out))}
    points = plot.points()
    assert [p.config.ratio for p in points] == [0.25, 0.75] and all(p.prompts == 1 for p in points)
    x, y = plot.xy()
    np.testing.assert_allclose(x, [100 * float(rows[r]["compression_ratio"]) for r in ("0.25", "0.75")])
    np.testing.assert_array_equal(y, [float(rows[r]["agreement"]) for r in ("0.25", "0.75")])
    assert plot.errorBars is None  # one prompt: no interval to draw
    text = plot.frontier_texts()[0]
    assert "1 prompt ·" in text and "[" not in text
    assert "One prompt: no intervals." in window.sweepPanel.estimateLabel.text()
