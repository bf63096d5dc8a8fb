"""The per-token strip in the real window on the demo model: its values equal kvcore.measure.metrics per step on
logits the test computes itself, the divergence marker sits on the first differing token, and hovering a token
shows the softmax top-5 of both caches and marks the token in both continuations."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from kvcore.engine.session import CompressionConfig
from kvcore.measure import metrics
from tests.app.waiting import wait_until
from tests.app.windows import shown_after, window_and_reference
from tests.reference_logits import compressed_logits, dense_logits

TOKENS = 8
CONFIG = {"method": "streaming_llm", "ratio": 0.2, "bits": None, "schedule": "paper"}


@pytest.fixture(scope="module")
def ctx(qapp, model_dirs, tmp_path_factory):
    window, ref = window_and_reference(model_dirs, tmp_path_factory.mktemp("settings") / "s.json", TOKENS)
    window.resize(1400, 1000)
    shown_after(window, lambda: window.controls.set_config(CONFIG))
    state = ref.compress(CompressionConfig.from_dict(window.controls.config()))
    tokens = ref.dense_tokens
    dense = dense_logits(ref.model, ref.prompt_ids, tokens)
    comp = compressed_logits(ref.model, state.cache, ref.prompt_ids, tokens, "paper", dense)
    yield {"window": window, "ref": ref, "state": state, "dense": dense, "comp": comp}
    window.close()
    QApplication.processEvents()


def _softmax(logits: np.ndarray) -> np.ndarray:
    x = np.exp(logits.astype(np.float64) - logits.max())
    return x / x.sum()


def test_strip_values_equal_kvcore_metrics_per_step(ctx):
    window, ref, dense, comp = ctx["window"], ctx["ref"], ctx["dense"], ctx["comp"]
    strip, targets = window.comparison.strip, np.array(ref.dense_tokens)
    kl = [
        metrics.teacher_forced(dense[i : i + 1], comp[i : i + 1], targets[i : i + 1])["kl_mean"]
        for i in range(TOKENS)
    ]
    np.testing.assert_allclose(strip.plotted_kl(), kl, rtol=1e-3, atol=1e-5)
    assert strip.plotted_kl()[0] == 0.0  # "paper": the first token comes from the dense prefill
    agree = comp.argmax(axis=-1) == targets
    assert strip.plotted_cells() == ["dense"] + ["same" if a else "other" for a in agree[1:]]
    assert max(kl) > 0.01 and not agree.all(), "streaming_llm at 20 % should change the distributions"

    free = ref.regenerate(ctx["state"]).tokens
    first = next(i for i, (a, b) in enumerate(zip(ref.dense_tokens, free, strict=True)) if a != b)
    assert strip.divergence_marker() == first > 0
    assert window.comparison.compressedTextView.toPlainText() == "".join(ref.token_texts(free))


def test_hover_shows_both_softmax_top5_and_marks_the_token_in_both_texts(ctx):
    window, ref, dense, comp = ctx["window"], ctx["ref"], ctx["dense"], ctx["comp"]
    view, strip = window.comparison, window.comparison.strip
    column = strip.divergence_marker()
    wait_until(lambda: strip.agreePlot.vb.width() > 100)
    QTest.qWait(50)
    point = strip.graphics.mapFromScene(strip.agreePlot.vb.mapViewToScene(QPointF(column + 0.5, 0.5)))
    QTest.mouseMove(strip.graphics.viewport(), point)
    wait_until(lambda: strip.hovered() == column, timeout=5)
    assert view.marked_token() == column
    assert view.marked_span("dense") == view.token_span("dense", column)
    assert view.marked_span("compressed") == view.token_span("compressed", column)

    rows = strip.top5_rows(column)
    text = strip.top5Label.text()
    for side, logits in ((0, dense[column]), (2, comp[column])):
        p = _softmax(logits)
        top = np.argsort(-p, kind="stable")[:5]
        assert [r[side] for r in rows] == ref.token_texts(top.tolist())
        np.testing.assert_allclose([r[side + 1] for r in rows], p[top], rtol=1e-3, atol=1e-6)
        assert all(f"{100 * q:.1f} %" in text for q in p[top])
    assert (
        rows[0][0] == ref.token_texts([ref.dense_tokens[column]])[0]
    )  # greedy: the dense top-1 is the token


def test_strip_exports_png_and_svg(ctx, tmp_path):
    window = ctx["window"]
    for suffix, magic in ((".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml")):
        path = tmp_path / f"per_token{suffix}"
        assert window.export_strip_image(path)
        assert path.read_bytes().startswith(magic) and path.stat().st_size > 500
    assert not window.export_strip_image(tmp_path / "per_token.gif")
    assert "png or .svg" in window.last_error
