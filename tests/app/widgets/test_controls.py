"""CompressionControls: config dict, signals on every change, invalid choices disabled with a reason."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSlider

from app.widgets.controls import DEFAULTS, CompressionControls
from kvcore.methods import available


@pytest.fixture
def controls(qtbot):
    widget = CompressionControls()
    qtbot.addWidget(widget)
    return widget


def test_defaults_and_object_names(controls):
    assert controls.config() == DEFAULTS
    assert [controls.methodCombo.itemText(i) for i in range(controls.methodCombo.count())] == list(
        available()
    )
    assert controls.findChild(QSlider, "retentionSlider") is controls.retentionSlider
    assert controls.autoRegenerateCheck.isChecked() and controls.auto_regenerate()
    assert controls.retentionLabel.text() == "25 %"
    assert controls.bitsLabel.text() == "16 (off)"


def test_custom_methods(qtbot):
    widget = CompressionControls(methods=["snapkv", "knorm"])
    qtbot.addWidget(widget)
    assert widget.methodCombo.count() == 2


def test_retention_slider_emits_ratio(controls, qtbot):
    with qtbot.waitSignal(controls.configChanged) as blocker:
        controls.retentionSlider.setValue(40)
    assert blocker.args[0]["ratio"] == pytest.approx(0.40)
    assert controls.retentionLabel.text() == "40 %"
    controls.retentionSlider.setValue(0)
    assert controls.config()["ratio"] == pytest.approx(0.01)


def test_bits_slider_steps_and_keyboard(controls, qtbot):
    controls.bitsSlider.setValue(0)
    values = []
    controls.configChanged.connect(lambda c: values.append(c["bits"]))
    controls.bitsSlider.setFocus()
    for _ in range(7):
        qtbot.keyClick(controls.bitsSlider, Qt.Key.Key_Right)
    assert values == [3, 4, 5, 6, 8, None]
    assert controls.bitsLabel.text() == "16 (off)"


def test_set_config_round_trip_emits_once(controls, qtbot):
    wanted = {
        "method": "h2o",
        "ratio": 0.5,
        "bits": 4,
        "value_bits": 2,
        "fp_recent": 32,
        "group_size": 32,
        "per_head": False,
        "window": 32,
        "n_sink": 8,
        "kernel": 7,
        "schedule": "mlx-lm",
        "params": {},
        "quant": "affine",
    }
    emitted = []
    controls.configChanged.connect(emitted.append)
    controls.set_config(wanted)
    assert emitted == [wanted]
    assert controls.config() == wanted
    assert controls.bitsLabel.text() == "4-bit"
    with pytest.raises(ValueError):
        controls.set_config({"bits": 7})


def test_schedule_choice_explains_both_schedules(controls, qtbot):
    combo = controls.scheduleCombo
    assert [combo.itemData(i) for i in range(combo.count())] == ["paper", "mlx-lm"]
    assert controls.config()["schedule"] == "paper"
    tips = [combo.itemData(i, Qt.ItemDataRole.ToolTipRole) for i in range(combo.count())]
    assert "dense prefill" in tips[0] and "last token" in tips[1]
    assert "paper:" in combo.toolTip() and "mlx-lm:" in combo.toolTip()
    with qtbot.waitSignal(controls.configChanged) as blocker:
        combo.setCurrentIndex(1)
    assert blocker.args[0]["schedule"] == "mlx-lm"
    with pytest.raises(ValueError, match="schedule must be one of"):
        controls.set_config({"schedule": "later"})


def test_every_control_emits(controls, qtbot):
    for change in (
        lambda: controls.methodCombo.setCurrentText(
            "snapkv" if controls.methodCombo.currentText() != "snapkv" else "h2o"
        ),
        lambda: controls.perHeadCheck.toggle(),
        lambda: controls.methodCombo.setCurrentText("snapkv"),
        lambda: controls.methodParameters.spin("window").setValue(16),
        lambda: controls.methodParameters.spin("kernel").setValue(3),
        lambda: controls.bitsSlider.setValue(2),
        lambda: controls.groupSizeCombo.setCurrentIndex(2),
    ):
        with qtbot.waitSignal(controls.configChanged, timeout=500):
            change()
    controls.set_config({"method": "streaming_llm"})
    with qtbot.waitSignal(controls.configChanged, timeout=500) as blocker:
        controls.methodParameters.spin("n_sink").setValue(2)
    assert blocker.args[0]["n_sink"] == 2
    controls.set_config({"method": "pyramidkv"})
    with qtbot.waitSignal(controls.configChanged, timeout=500) as blocker:
        controls.methodParameters.spin("beta").setValue(7)
    assert blocker.args[0]["params"] == {"beta": 7} and blocker.args[0]["window"] == 16


def test_group_size_disabled_for_head_dim(controls):
    controls.set_config({"bits": 4, "group_size": 128})
    controls.set_head_dim(32)
    combo = controls.groupSizeCombo
    assert controls.config()["group_size"] == 32
    flags = [combo.model().flags(combo.model().index(i, 0)) & Qt.ItemFlag.ItemIsEnabled for i in range(3)]
    assert [bool(f) for f in flags] == [True, False, False]
    assert combo.itemData(1, Qt.ItemDataRole.ToolTipRole) == "head_dim 32 is not divisible by group size 64"
    controls.set_head_dim(128)
    assert all(combo.model().flags(combo.model().index(i, 0)) & Qt.ItemFlag.ItemIsEnabled for i in range(3))


def test_group_size_disabled_for_the_value_width_while_values_are_packed(controls):
    """deepseek_v2-like widths: keys 64, values 32; 64 fits the keys only, so it needs float values."""
    combo = controls.groupSizeCombo

    def enabled():
        return [
            bool(combo.model().flags(combo.model().index(i, 0)) & Qt.ItemFlag.ItemIsEnabled) for i in range(3)
        ]

    controls.set_config({"bits": 4, "value_bits": None, "group_size": 64})
    controls.set_head_dim(64, 32)
    assert enabled() == [True, False, False] and controls.config()["group_size"] == 32
    assert (
        combo.itemData(1, Qt.ItemDataRole.ToolTipRole) == "value width 32 is not divisible by group size 64"
    )
    assert combo.itemData(2, Qt.ItemDataRole.ToolTipRole) == "head_dim 64 is not divisible by group size 128"
    controls.set_config({"bits": 4, "value_bits": 16})
    assert enabled() == [True, True, False] and combo.itemData(1, Qt.ItemDataRole.ToolTipRole) == ""
    controls.set_config({"bits": 16, "value_bits": 4})
    assert enabled() == [True, False, False]


def test_irrelevant_controls_disabled_with_reason(controls):
    controls.set_config({"method": "full", "bits": None})
    assert not controls.retentionSlider.isEnabled()
    assert controls.retentionSlider.toolTip() == "full keeps every position"
    assert not controls.groupSizeCombo.isEnabled()
    assert "16 bits" in controls.groupSizeCombo.toolTip()
    controls.set_config({"method": "tova"})
    assert not controls.perHeadCheck.isEnabled() and controls.config()["per_head"] is False
    assert "tova keeps the same positions" in controls.perHeadCheck.toolTip()
    assert controls.methodParameters.spin("window") is None  # tova declares no window
    controls.set_config({"method": "snapkv", "bits": 4})
    assert controls.retentionSlider.isEnabled() and controls.methodParameters.spin("window").isEnabled()
    assert controls.groupSizeCombo.isEnabled()
    assert controls.methodParameters.spin("window").toolTip().startswith("observation window")


def test_separate_kv_reveals_a_value_slider_and_emits_value_bits(controls, qtbot):
    from app.widgets.controls import BITS_STEPS
    from kvcore.defaults import DEFAULT_SPLIT_VALUE_BITS

    assert controls.valueBitsRow.isHidden() and not controls.groupSizeCombo.isEnabled()  # 16 bits
    controls.set_config({"bits": 8})
    assert controls.splitBitsCheck.isEnabled()
    with qtbot.waitSignal(controls.configChanged) as blocker:
        controls.splitBitsCheck.setChecked(True)
    assert not controls.valueBitsRow.isHidden()
    assert blocker.args[0]["bits"] == 8 and blocker.args[0]["value_bits"] == DEFAULT_SPLIT_VALUE_BITS
    controls.valueBitsSlider.setValue(BITS_STEPS.index(8))  # the keys' width: no split
    assert controls.config()["value_bits"] is None
    controls.valueBitsSlider.setValue(BITS_STEPS.index(16))  # 8-bit keys with float values
    assert controls.config()["value_bits"] == 16 and controls.valueBitsLabel.text() == "16 (off)"
    controls.set_config(
        {"bits": None, "value_bits": 4}
    )  # float keys, packed values: quantized, group applies
    assert controls.config()["bits"] is None and controls.config()["value_bits"] == 4
    assert controls.groupSizeCombo.isEnabled() and controls.quantized()
    controls.set_config({"bits": 6, "value_bits": 2})
    assert controls.config()["value_bits"] == 2 and controls.valueBitsLabel.text() == "2-bit"
    controls.set_config({"value_bits": None})
    assert not controls.splitBitsCheck.isChecked() and controls.valueBitsRow.isHidden()
    with pytest.raises(ValueError, match="value_bits"):
        controls.set_config({"bits": 8, "value_bits": 7})


def test_adakv_after_tova_selects_per_head(controls):
    """tova forces shared selection; adakv after it used to keep per_head off and every compress failed
    ("adakv needs per-head selection"), found by the random-actions test."""
    from kvcore.engine.session import CompressionConfig

    controls.set_config({"method": "tova"})
    assert controls.config()["per_head"] is False
    controls.methodCombo.setCurrentIndex(controls.methodCombo.findText("adakv"))
    assert controls.config()["per_head"] is True and not controls.perHeadCheck.isEnabled()
    assert "adakv" in controls.perHeadCheck.toolTip()
    assert CompressionConfig.from_dict(controls.config()).per_head
    controls.set_config({"method": "snapkv"})
    assert controls.perHeadCheck.isEnabled()


def test_every_listed_method_is_an_engine_method(controls):

    from kvcore.engine.session import CompressionConfig

    for name in available():
        controls.methodCombo.setCurrentText(name)
        assert CompressionConfig.from_dict(controls.config()).method == name
    controls.methodCombo.setCurrentText("adakv-expected_attention")
    params = controls.methodParameters
    assert params.spin("n_sink") is not None and params.spin("window") is None
    assert params.spin("alpha").value() == 0.2
    assert controls.perHeadCheck.isChecked() and not controls.perHeadCheck.isEnabled()


def test_fp_recent_spin_sits_with_the_bits_and_applies_only_when_packing(controls, qtbot):
    spin = controls.fpRecentSpin
    controls.set_config({"bits": None, "value_bits": None, "fp_recent": 64})
    assert not spin.isEnabled() and "everything is float" in spin.toolTip()
    assert controls.config()["fp_recent"] == 0  # nothing packed: no residual
    with qtbot.waitSignal(controls.configChanged) as blocker:
        controls.set_config({"bits": 4})
    assert spin.isEnabled() and "last R prompt positions" in spin.toolTip()
    assert blocker.args[0]["fp_recent"] == 64 and blocker.args[0]["bits"] == 4
    spin.setValue(0)
    assert controls.config()["fp_recent"] == 0 and spin.text() == "off"


def test_the_scheme_combo_lists_the_schemes_and_emits_quant(controls, qtbot):
    from kvcore.quant import available as schemes
    from kvcore.quant import get as get_scheme

    combo = controls.quantCombo
    assert [combo.itemData(i) for i in range(combo.count())] == list(schemes())
    index = combo.findData("nvfp4")
    assert combo.itemData(index, Qt.ItemDataRole.ToolTipRole) == get_scheme("nvfp4").description
    controls.bitsSlider.setValue(2)  # 4 bits
    with qtbot.waitSignal(controls.configChanged) as blocker:
        combo.setCurrentIndex(index)
    config = blocker.args[0]
    assert (config["quant"], config["bits"], config["group_size"]) == ("nvfp4", 4, 16)
    assert not controls.groupSizeCombo.isEnabled()
    assert "nvfp4 fixes its group size: 16" in controls.groupSizeCombo.toolTip()


def test_the_bits_slider_skips_widths_the_scheme_does_not_pack(controls, qtbot):
    controls.set_config({"quant": "mxfp4", "bits": 4})
    assert "mxfp4 packs 4 bits only" in controls.bitsSlider.toolTip()
    values = []
    controls.configChanged.connect(lambda c: values.append(c["bits"]))
    controls.bitsSlider.setFocus()
    qtbot.keyClick(controls.bitsSlider, Qt.Key.Key_Right)  # 5 is not an MXFP4 width: on to 16 (off)
    qtbot.keyClick(controls.bitsSlider, Qt.Key.Key_Left)  # 8 is not either: back to 4
    assert values == [None, 4]
    controls.set_config({"quant": "affine"})
    assert "packs" not in controls.bitsSlider.toolTip()


def test_unquantized_names_the_baseline_it_stores(controls):
    controls.set_config({"bits": None})
    assert controls.bitsLabel.text() == "16 (off)"  # no model yet: the width the slider means
    controls.set_baseline("float32")
    assert controls.bitsLabel.text() == "off (float32)"
    controls.set_config({"bits": 8, "value_bits": 16})
    assert controls.bitsLabel.text() == "8-bit" and controls.valueBitsLabel.text() == "off (float32)"


@pytest.mark.parametrize(
    "name, paper",
    [
        ("turboquant", "arXiv 2504.19874"),
        ("turboquant_prod", "arXiv 2504.19874"),
        ("qjl", "arXiv 2406.03482"),
    ],
)
def test_the_sketching_schemes_are_offered_with_their_paper_and_parameters(controls, qtbot, name, paper):
    combo = controls.quantCombo
    index = combo.findData(name)
    tip = combo.itemData(index, Qt.ItemDataRole.ToolTipRole)
    assert paper in tip and "simulated" in tip and "seed = 0" in tip
    controls.bitsSlider.setValue(1)  # 3 bits
    with qtbot.waitSignal(controls.configChanged) as blocker:
        combo.setCurrentIndex(index)
    assert (blocker.args[0]["quant"], blocker.args[0]["bits"]) == (name, 3)


def test_a_schemes_parameters_show_under_it_and_travel_in_its_spec(controls, qtbot):
    controls.set_config({"bits": 4})
    assert not controls.quantParameters.isVisible() or controls.quantParameters.spin("packing") is None
    controls.quantCombo.setCurrentIndex(controls.quantCombo.findData("rotated"))
    packing = controls.quantParameters.spin("packing")
    assert packing.objectName() == "quantPackingCombo" and packing.currentText() == "affine"
    assert controls.config()["quant"] == "rotated"
    with qtbot.waitSignal(controls.configChanged) as blocker:
        packing.setCurrentText("mxfp4")
    assert (blocker.args[0]["quant"], blocker.args[0]["group_size"]) == ("rotated:packing=mxfp4", 32)
    controls.set_config({"quant": "rotated:packing=nvfp4,seed=3"})
    assert controls.quantParameters.spin("packing").currentText() == "nvfp4"
    assert controls.quantParameters.spin("seed").value() == 3
    controls.set_config({"quant": "kivi"})
    assert controls.quantParameters.spin("residual").value() == 128 and controls.config()["quant"] == "kivi"
    assert not controls.fpRecentSpin.isEnabled() and controls.config()["fp_recent"] == 0
    with pytest.raises(ValueError, match="packing must be one of"):
        controls.set_config({"quant": "rotated:packing=int3"})


def test_edge_layers_set_the_layer_widths_and_keep_a_width_the_scheme_packs(controls, qtbot):
    assert "edge_layers" not in controls.config() and not controls.edgeBitsSpin.isEnabled()
    controls.set_config({"bits": 4})
    with qtbot.waitSignal(controls.configChanged) as blocker:
        controls.edgeLayersSpin.setValue(2)
    assert (blocker.args[0]["edge_layers"], blocker.args[0]["edge_bits"]) == (2, 8)
    controls.edgeBitsSpin.setValue(7)  # affine packs no 7 bits: stepping down from 8 goes on to 6
    assert controls.config()["edge_bits"] == 6
    controls.edgeBitsSpin.setValue(7)  # and up from 6 on to 8
    assert controls.config()["edge_bits"] == 8
    controls.set_config({"quant": "mxfp4"})  # a dict naming the scheme without layer widths has none
    assert "edge_layers" not in controls.config()
    controls.set_config({"edge_layers": 1})
    assert (controls.config()["edge_layers"], controls.config()["edge_bits"]) == (1, 4)
    controls.set_config({"bits": None})
    assert "edge_layers" not in controls.config() and not controls.edgeLayersSpin.isEnabled()


@pytest.mark.parametrize("name, paper", [("kivi", "arXiv 2402.02750"), ("rotated", "arXiv 2404.00456")])
def test_the_genuine_schemes_tooltips_name_their_paper(controls, name, paper):
    combo = controls.quantCombo
    assert paper in combo.itemData(combo.findData(name), Qt.ItemDataRole.ToolTipRole)


def test_a_disabled_panel_still_emits_its_residual_and_edge_layers(controls):
    controls.set_config({"bits": 4, "fp_recent": 32, "edge_layers": 1})
    controls.setEnabled(False)  # the window greys the panel while a job runs
    config = controls.config()
    assert (config["fp_recent"], config["edge_layers"]) == (32, 1)


def test_a_width_per_layer_is_carried_until_edge_layers_replace_it(controls):
    controls.set_config({"quant": "affine", "bits": 4, "layer_bits": [8, 4, 4, 8]})
    assert controls.config()["layer_bits"] == [8, 4, 4, 8]
    assert "8,4,4,8" in controls.edgeLayersSpin.toolTip()
    controls.edgeLayersSpin.setValue(1)
    config = controls.config()
    assert "layer_bits" not in config and config["edge_layers"] == 1
    controls.set_config({"quant": "affine"})
    assert "layer_bits" not in controls.config() and "edge_layers" not in controls.config()


def test_every_method_in_the_chooser_names_its_definition_and_paper(controls):
    """The tooltip of each item of the method box (and of the Sweep list): definition and paper, a wrapper's inner
    method's too; as rich text, so Qt wraps long titles."""
    import html

    from app.widgets.method_list import MethodChecklist
    from kvcore.methods import get

    combo = controls.methodCombo
    names = [combo.itemText(i) for i in range(combo.count())]
    checklist = MethodChecklist(names, [], "tipList")
    for i, name in enumerate(names):
        tip = combo.itemData(i, Qt.ItemDataRole.ToolTipRole)
        method = get(name)
        for m in (method, getattr(method, "inner", None)):
            if m is not None:
                assert html.escape(m.description) in tip and html.escape(m.paper) in tip, name
        assert tip.startswith("<qt>") and "<i>Paper:</i>" in tip
        assert checklist.item(i).toolTip() == tip
    snap = combo.itemData(names.index("snapkv"), Qt.ItemDataRole.ToolTipRole)
    assert "arXiv:2404.14469" in snap
