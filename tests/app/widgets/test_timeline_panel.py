"""The timeline panel on a hand-made run (no model): what each cell is drawn as, for one head and for the share
of heads, and what hovering a cell or a token says."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.timeline_jobs import TimelineView
from app.engine.view_model import TokenSteps
from app.widgets import timeline as timeline_widget
from app.widgets.heatmap import KEPT_RGBA
from app.widgets.timeline import EVICTED_RGBA, UNWRITTEN_RGBA, TimelinePanel, summary_text
from kvcore.engine.timeline import timeline
from tests.kvcore.engine.test_timeline import START, _hand_run

N_PROMPT = 6  # "paper": the cache starts with the whole prompt; the last generated token is never written


def _view() -> TimelineView:
    run = _hand_run()
    n = len(run.tokens) + 1  # paper: one more token than steps
    k = 2
    steps = TokenSteps(
        tokens=[f"g{i}" for i in range(n)],
        kl=np.array([0.0, 0.5, 0.0, 2.0, 0.1]),
        agreement=np.array([True, True, True, False, True]),
        dense_top_ids=np.zeros((n, k), np.int64),
        dense_top_probs=np.full((n, k), 0.5),
        dense_top_texts=[[], *[["a", "b"]] * (n - 1)],
        compressed_top_ids=np.zeros((n, k), np.int64),
        compressed_top_probs=np.full((n, k), 0.5),
        compressed_top_texts=[[], *[["a", "c"]] * (n - 1)],
        first_divergence=3,
        first_compared=1,
    )
    return TimelineView(
        timeline=timeline(run, N_PROMPT, START),
        policy={"method": "streaming_llm", "budget": 4, "interval": 2, "n_sink": 1},
        prefill_config=None,
        token_texts=[f"p{i}" for i in range(N_PROMPT)] + [f"g{i}" for i in range(n)],
        n_prompt=N_PROMPT,
        n_layers=2,
        n_kv_heads=2,
        not_compressible_labels={1: "sliding window 8: not compressible"},
        token_steps=steps,
        max_cache_tokens=6,
        compression_steps=[2, 4],
        seconds=1.0,
    )


@pytest.fixture
def panel(qapp):
    p = TimelinePanel()
    p.set_view(_view())
    yield p
    p.close()


def _classes(rgba: np.ndarray) -> list[str]:
    names = {KEPT_RGBA: "held", EVICTED_RGBA: "evicted", UNWRITTEN_RGBA: "unwritten"}
    return [names[tuple(int(v) for v in c)] for c in rgba]


def test_one_head_is_drawn_held_evicted_or_unwritten(panel):
    panel.set_head(0, 1)
    assert panel.image.image.shape[:2] == (5, 10)
    assert _classes(panel.displayed_row(2)) == [
        *["held", "evicted", "evicted", "evicted", "held", "evicted", "evicted", "held"],
        *["unwritten", "unwritten"],
    ]
    assert panel.step() == 4 and panel.stepLabel.text() == "Step 4 / 4 · evicted"
    np.testing.assert_array_equal(panel.image.image[2], panel.displayed_row(2))


def test_share_of_heads_runs_from_evicted_to_kept(panel):
    panel.set_head(None)
    assert not panel.layerCombo.isEnabled()
    row = panel.displayed_row(2)
    assert tuple(row[0]) == KEPT_RGBA  # both heads of the compressible layer hold position 0
    assert tuple(row[1]) == EVICTED_RGBA  # neither does
    half = row[5]  # head 0 holds it, head 1 does not
    assert all(
        min(a, b) < h < max(a, b) for h, a, b in zip(half[:3], EVICTED_RGBA[:3], KEPT_RGBA[:3], strict=True)
    )
    assert tuple(row[9]) == UNWRITTEN_RGBA


def test_hover_texts(panel):
    panel.set_head(0, 1)
    assert panel.info_at(2, 1).endswith(
        "L0 h1: dropped by the prefill compression · held by 0 % of the compressible kv-heads at this step"
    )
    assert "L0 h1: held; evicted at step 4" in panel.info_at(3, 4)
    assert "L0 h1: evicted at step 2" in panel.info_at(3, 2)
    assert (
        panel.info_at(1, 8)
        == "Step 1 · position 8 (generated 2) · token 'g2' · not written yet (written at step 3)"
    )
    assert panel.info_at(4, 10).endswith("the last token generated: never written to the cache")
    panel.set_head(1, 0)
    assert "L1 h0: held (sliding window 8: not compressible)" in panel.info_at(4, 3)
    assert panel.token_info(0) == "generated 0 'g0' · from the dense prefill: nothing to compare"
    assert panel.token_info(3) == (
        "generated 3 'g3' · KL 2 · other top-1 · dense: 'a' 50 %, 'b' 50 % · policy: 'a' 50 %, 'c' 50 %"
    )


def test_strip_aligns_with_positions_and_summary(panel):
    bars = panel.klBars.opts
    assert list(np.asarray(bars["x0"]) - 0.1) == pytest.approx([6, 7, 8, 9, 10])
    assert panel.divergenceLines[0].value() == pytest.approx(N_PROMPT + 3 + 0.5)
    text = summary_text(panel.view())
    assert text.startswith("streaming_llm · budget 4 · every 2 after the full prefill cache: 5 tokens")
    assert "first diverges at generated token 3" in text and "top-1 agreement 75 %" in text


def test_a_long_run_is_sampled_to_the_image_size(panel, monkeypatch):
    monkeypatch.setattr(timeline_widget, "MAX_IMAGE", (3, 4))
    panel.set_head(0, 1)
    panel.set_head(None)
    panel.set_head(0, 1)
    image = panel.image.image
    assert image.shape[:2] == (3, 4)  # steps 0, 2, 4 and positions 0, 3, 6, 9
    np.testing.assert_array_equal(image[1], panel.displayed_row(2)[[0, 3, 6, 9]])
    assert panel.image.mapRectToParent(panel.image.boundingRect()).height() == pytest.approx(6)


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_export_image(panel, tmp_path, suffix, magic):
    path = tmp_path / f"timeline{suffix}"
    panel.export_image(path, 400)
    assert path.read_bytes().lstrip()[: len(magic)] == magic


def test_every_decoding_policy_names_its_definition_and_paper(qapp):
    """The Policy chooser's tooltips: a prefill method re-scored while decoding says so and shows its own
    definition and paper; h2o_online, dms and cam their declared ones."""
    from PySide6.QtCore import Qt

    from kvcore.defaults import DECODE_POLICY_HELP
    from kvcore.engine.decoding import DECODE_METHODS
    from kvcore.methods import get

    panel = TimelinePanel()
    combo = panel.methodCombo
    for i, name in enumerate(DECODE_METHODS):
        tip = combo.itemData(i, Qt.ItemDataRole.ToolTipRole)
        assert tip.startswith("<qt>") and "<i>Paper:</i>" in tip, name
        paper = DECODE_POLICY_HELP[name][1] if name in DECODE_POLICY_HELP else get(name).paper
        assert paper.split(",")[0].replace("'", "&#x27;") in tip, name
    cam = combo.itemData(DECODE_METHODS.index("cam"), Qt.ItemDataRole.ToolTipRole)
    assert "CaM: Cache Merging" in cam and "LCTmppB165" in cam
