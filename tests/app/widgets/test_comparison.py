"""ComparisonView marks the first divergence in both texts; MetricsPanel formats and shows '—'."""

from __future__ import annotations

from PySide6.QtGui import QTextCursor

from app.widgets.comparison import DIVERGENCE_BACKGROUND, ComparisonView, MetricsPanel


def _background_at(view, position):
    cursor = QTextCursor(view.document())
    cursor.setPosition(position + 1)
    fmt = cursor.charFormat()
    return fmt.background().color() if fmt.hasProperty(fmt.Property.BackgroundBrush) else None


def test_first_divergence_marked_in_both(qtbot):
    view = ComparisonView()
    qtbot.addWidget(view)
    dense = ["def", " f", "(x", "):", "\n", "  return", " x"]
    compressed = ["def", " f", "(y", "):", "\n", "  pass"]
    view.set_texts(dense, compressed, 2)
    assert view.denseTextView.toPlainText() == "".join(dense)
    assert view.compressedTextView.toPlainText() == "".join(compressed)
    assert view.denseTextView.isReadOnly() and view.compressedTextView.isReadOnly()
    for which, widget in (("dense", view.denseTextView), ("compressed", view.compressedTextView)):
        start, end = view.token_span(which, 2)
        assert end - start == 2
        assert _background_at(widget, start) == DIVERGENCE_BACKGROUND
        assert _background_at(widget, view.token_span(which, 0)[0]) is None
        assert _background_at(widget, view.token_span(which, 3)[0]) is None
    assert "2" in view.toolTip()


def test_no_divergence_marks_nothing(qtbot):
    view = ComparisonView()
    qtbot.addWidget(view)
    view.set_texts(["a", "b"], ["a", "b"], None)
    for which, widget in (("dense", view.denseTextView), ("compressed", view.compressedTextView)):
        assert all(_background_at(widget, view.token_span(which, i)[0]) is None for i in range(2))
    assert view.toolTip() == "The continuations agree"


def test_metrics_panel_formats_and_missing(qtbot):
    panel = MetricsPanel()
    qtbot.addWidget(panel)
    assert panel.objectName() == "metricsPanel"
    assert panel.text().count("—") == 13
    panel.set_metrics(
        {
            "bytes_dense": 4 * 1024 * 1024,
            "bytes_compressed": 512 * 1024,
            "compression_ratio": 8.0,
            "bytes_not_compressible": 2048,
            "compressible_ratio": 0.25,
            "agreement": 0.875,
            "kl_mean": 0.01234,
            "kl_max": 0.5,
            "nll_delta": 0.031,
            "first_divergence": 12,
            "recompress_ms": 3.21,
        }
    )
    text = panel.text()
    assert "Bytes dense: 4.00 MiB" in text
    assert "Bytes compressed: 512.00 KiB" in text
    assert "Compression ratio: 8.00×" in text
    assert "Not compressible: 2.00 KiB" in text and "Ratio, compressible layers: 0.25×" in text
    assert "Top-1 agreement: 87.5 %" in text
    assert "KL mean: 0.01234" in text and "NLL delta: +0.031" in text
    assert "First divergence: token 12" in text
    assert "Recompress: 3.2 ms" in text and "Regenerate: —" in text
    panel.set_metrics({"first_divergence": None})
    assert panel.value_text("first_divergence") == "none"
    assert panel.value_text("bytes_dense") == "—"


def test_metrics_panel_names_the_dense_cache_the_ratios_are_of(qtbot):
    panel = MetricsPanel()
    qtbot.addWidget(panel)
    panel.set_metrics({"bytes_dense": 4096, "compression_ratio": 4.0})
    assert "Bytes dense: 4.00 KiB" in panel.text()
    assert "of the dense cache" in panel.tooltip("compression_ratio")
    panel.set_baseline("float32")
    assert "Bytes dense (float32): 4.00 KiB" in panel.text()
    assert "Compression ratio: 4.00×" in panel.text()
    for key in ("bytes_dense", "compression_ratio", "compressible_ratio"):
        assert "float32 cache" in panel.tooltip(key)
    panel.set_baseline(None)
    assert "Bytes dense: 4.00 KiB" in panel.text() and "float32" not in panel.tooltip("compression_ratio")
