"""cam in the Timeline dock (issue 40): the merges a decode from the GUI records equal a Session's decoding the same
in the test thread; each is drawn as an arc at the step its position left, and the hover says where the value
went and how many merged values a kept position holds."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.window.main_window import MainWindow
from kvcore.engine.decoding import DecodingPolicy, decode_with_policy
from kvcore.engine.session import CompressionConfig, Session
from tests.app.waiting import wait_until

PROMPT = "def main(argv): return sum(x * x for x in argv) The quick brown fox jumps over the lazy dog."
DECODED, BUDGET, INTERVAL = 24, 16, 8


@pytest.fixture(scope="module")
def decoded(qapp, model_dirs, tmp_path_factory):
    """The window after a cam decode from the full prefill cache, and the reference run's merges by head."""
    model = str(model_dirs["llama"])
    window = MainWindow(
        model=model, settings_path=tmp_path_factory.mktemp("s") / "s.json", continuation_tokens=2
    )
    window.resize(1280, 800)
    window.show()
    wait_until(lambda: window.model_info is not None)
    window.sessionPanel.chatTemplateCheck.setChecked(False)
    window.prefill(PROMPT)
    wait_until(lambda: window.displayed_ids)
    panel = window.timelinePanel
    panel.set_policy("cam", BUDGET, INTERVAL, DECODED)
    panel.prefillCheck.setChecked(False)
    QTest.mouseClick(panel.runButton, Qt.MouseButton.LeftButton)
    wait_until(lambda: not window.timeline.running, timeout=120)
    ref = Session.load(model)
    ref.prefill(PROMPT, n_tokens=2, chat_template=False)
    state = ref.compress(CompressionConfig("full", 1.0, schedule=window.controls.config()["schedule"]))
    run = decode_with_policy(ref, state, DecodingPolicy("cam", BUDGET, INTERVAL), DECODED)
    by_head: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for c in run.compressions:
        for layer, heads in enumerate(c.merges or []):
            for h, merge in enumerate(heads or []):
                by_head.setdefault((layer, h), []).extend((c.step, int(a), int(b)) for a, b in merge.pairs)
    yield window, by_head
    window.close()
    QApplication.processEvents()


def test_cam_merges_are_drawn_per_head_as_the_reference_records_them(decoded):
    window, by_head = decoded
    panel = window.timelinePanel
    assert panel.view().merges is not None and sum(map(len, by_head.values())) > 0
    for layer, h in [(0, 0), (3, 1)]:
        panel.set_head(layer, h)
        QApplication.processEvents()
        assert panel.merge_arcs() == by_head[(layer, h)]
        x, _ = panel.mergeArcs.getData()
        assert np.isnan(x).sum() == len(by_head[(layer, h)]), "one arc a merge"
    assert "cam merges" in panel.legendLabel.text()
    panel.set_head(None)
    QApplication.processEvents()
    assert panel.merge_arcs() == [] and "cam merges" not in panel.legendLabel.text()


def test_hover_says_where_a_merged_value_went(decoded):
    window, by_head = decoded
    panel = window.timelinePanel
    panel.set_head(1, 0)
    QApplication.processEvents()
    step, source, target = by_head[(1, 0)][-1]
    scene = panel.plot.vb.mapViewToScene(QPointF(source + 0.5, step - 0.5))
    QTest.mouseMove(panel.graphics.viewport(), panel.graphics.mapFromScene(scene))
    QApplication.processEvents()
    text = panel.graphics.toolTip()
    assert text == panel.info_at(step - 1, source)
    assert f"L1 h0: held; evicted at step {step}" in text
    assert f"merged at step {step} into " in text and f"{target} '" in text
    held = panel.info_at(step, target)
    n = sum(1 for s, _, t in by_head[(1, 0)] if t == target and s <= step)
    assert f"holds {n} merged value" in held
