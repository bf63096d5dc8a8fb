"""TokenStrip: bars and cells follow the data, the divergence marker sits on its token, hover shows the top-5
and marks the token in both continuations, export writes real PNG and SVG files."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtTest import QTest

from app.engine.view_model import TokenSteps
from app.widgets.comparison import ComparisonView
from app.widgets.session_panel import HOVER_BACKGROUND

N, K = 6, 5
DENSE = ["def", " f", "(x", "):", "\n", "  return"]
COMPRESSED = ["def", " f", "(y", "):", "\n"]


def _steps(divergence: int | None = 2, first_compared: int = 0) -> TokenSteps:
    rng = np.random.default_rng(0)
    probs = np.sort(rng.dirichlet(np.ones(12), size=(2, N))[..., :K], axis=-1)[..., ::-1]
    ids = rng.integers(0, 100, size=(2, N, K))
    return TokenSteps(
        tokens=DENSE,
        kl=np.array([0.0, 0.01, 0.8, 0.05, 0.3, 0.0]),
        agreement=np.array([True, True, False, True, False, True]),
        dense_top_ids=ids[0],
        dense_top_probs=probs[0],
        dense_top_texts=[[f"d{i}_{k}" for k in range(K)] for i in range(N)],
        compressed_top_ids=ids[1],
        compressed_top_probs=probs[1],
        compressed_top_texts=[[f"c{i}<{k}>" for k in range(K)] for i in range(N)],
        first_divergence=divergence,
        first_compared=first_compared,
    )


@pytest.fixture
def view(qtbot):
    widget = ComparisonView()
    widget.resize(900, 500)
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    widget.set_texts(DENSE, COMPRESSED, 2)
    widget.set_steps(_steps())
    qtbot.wait(30)  # let the axes size themselves before mapping mouse positions
    return widget


def _hover(qtbot, strip, column: int) -> None:
    qtbot.wait(50)  # pyqtgraph drops mouse moves that follow each other too closely; layouts settle
    plot = strip.agreePlot
    point = strip.graphics.mapFromScene(plot.vb.mapViewToScene(QPointF(column + 0.5, 0.5)))
    QTest.mouseMove(strip.graphics.viewport(), point)
    qtbot.waitUntil(lambda: strip.hovered() == column, timeout=2000)


def test_values_and_divergence_marker_are_drawn(view):
    strip, steps = view.strip, _steps()
    np.testing.assert_allclose(strip.plotted_kl(), steps.kl)
    assert strip.plotted_cells() == ["same" if a else "other" for a in steps.agreement]
    assert strip.divergence_marker() == 2
    assert all(line.isVisible() and line.value() == 2.5 for line in strip.divergenceLines)
    view.set_steps(_steps(divergence=None, first_compared=1))
    assert strip.divergence_marker() is None
    assert strip.plotted_cells()[:2] == ["dense", "same"] and "dense prefill" in strip.legendLabel.text()
    view.set_steps(None)
    assert strip.plotted_kl().size == 0 and not strip.has_data()


def test_hover_marks_the_token_in_both_texts_and_shows_the_top5(view, qtbot):
    strip, steps = view.strip, _steps()
    _hover(qtbot, strip, 3)
    assert view.marked_token() == 3
    assert view.marked_span("dense") == view.token_span("dense", 3)
    assert view.marked_span("compressed") == view.token_span("compressed", 3)
    assert view.denseTextView.extraSelections()[0].format.background().color() == HOVER_BACKGROUND
    rows = strip.top5_rows(3)
    assert [(r[0], r[2]) for r in rows] == list(
        zip(steps.dense_top_texts[3], steps.compressed_top_texts[3], strict=True)
    )
    assert [r[1] for r in rows] == pytest.approx(steps.dense_top_probs[3].tolist())
    text = strip.top5Label.text()
    assert "token 3" in text and "KL 0.05" in text
    for dense_text, dense_p, comp_text, comp_p in rows:
        assert dense_text in text and f"{100 * dense_p:.1f} %" in text
        assert comp_text.replace("<", "&lt;").replace(">", "&gt;") in text and f"{100 * comp_p:.1f} %" in text

    _hover(qtbot, strip, 5)  # the compressed run has no token 5: only the dense text is marked
    assert view.marked_span("dense") == view.token_span("dense", 5) and view.marked_span("compressed") is None
    _hover(qtbot, strip, -1)  # over the axis, left of the first token: nothing marked
    assert view.marked_token() is None and view.marked_span("dense") is None
    assert "Hover" in strip.top5Label.text()


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml")])
def test_export_image(view, tmp_path, suffix, magic):
    path = tmp_path / f"strip{suffix}"
    view.strip.export_image(path)
    data = path.read_bytes()
    assert data.startswith(magic) and len(data) > 500
    if suffix == ".svg":
        assert b"<svg" in data and data.count(b"<path") >= 2
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    with pytest.raises(ValueError):
        view.strip.export_image(tmp_path / "strip.jpg")
