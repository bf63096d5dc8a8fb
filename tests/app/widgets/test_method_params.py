"""Parameter widgets come from the methods' declarations: a new method file brings its own spin boxes."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QSpinBox

from app.widgets.controls import CompressionControls
from kvcore import methods
from kvcore.engine.session import CompressionConfig
from tests.conftest import STRIDED_METHOD


def _controls(qtbot) -> CompressionControls:
    widget = CompressionControls()
    qtbot.addWidget(widget)
    return widget


def _items(controls: CompressionControls) -> list[str]:
    return [controls.methodCombo.itemText(i) for i in range(controls.methodCombo.count())]


def test_a_new_integer_field_gets_a_spin_box_with_its_default_and_help(method_folder, qtbot):
    (method_folder / "strided.py").write_text(STRIDED_METHOD)
    controls = _controls(qtbot)
    assert "strided" in _items(controls) and "adakv-strided" in _items(controls)
    controls.methodCombo.setCurrentText("strided")
    spin = controls.methodParameters.spin("stride")
    assert isinstance(spin, QSpinBox) and spin.value() == 3 and spin.minimum() == 1
    assert "keep every stride-th position" in spin.toolTip()
    assert controls.config()["params"] == {"stride": 3}
    with qtbot.waitSignal(controls.configChanged) as blocker:
        spin.setValue(5)
    assert CompressionConfig.from_dict(blocker.args[0]).method_instance.stride == 5
    assert controls.methodParameters.spin("window") is None


def test_a_copied_method_file_is_listed(method_folder, qtbot):
    source = (Path(methods.__file__).parent / "snapkv.py").read_text()
    copy = source.replace("class SnapKV(Method)", "class SnapKVCopy(Method)").replace(
        'name = "snapkv"', 'name = "snapkv_copy"'
    )
    (method_folder / "snapkv_copy.py").write_text(copy)
    controls = _controls(qtbot)
    assert "snapkv_copy" in _items(controls)
    controls.methodCombo.setCurrentText("snapkv_copy")
    assert {"window", "kernel"} <= set(controls.methodParameters.values())
    assert controls.methodParameters.spin("kernel").value() == 5


def test_every_method_shows_each_declared_parameter(qtbot):
    controls = _controls(qtbot)
    for name in methods.available():
        controls.methodCombo.setCurrentText(name)
        for p in methods.get(name).parameters():
            spin = controls.methodParameters.spin(p.name)
            if (
                p.kind is tuple
            ):  # a list (per_layer_compression's layer_ratios) is set with --param, no spin box
                assert spin is None
                continue
            want = QComboBox if p.choices else QDoubleSpinBox if p.kind is float else QSpinBox
            assert isinstance(spin, want), (name, p.name)
            assert p.help in spin.toolTip()


def test_values_carry_across_methods_and_forced_per_head_keeps_the_users_choice(qtbot):
    controls = _controls(qtbot)
    controls.set_config({"method": "snapkv", "per_head": True})
    controls.methodParameters.spin("window").setValue(24)
    controls.methodCombo.setCurrentText("pyramidkv")
    assert controls.methodParameters.spin("window").value() == 24
    controls.perHeadCheck.setChecked(False)
    controls.methodCombo.setCurrentText("adakv")  # forces per-head on
    assert controls.config()["per_head"] is True and not controls.perHeadCheck.isEnabled()
    controls.methodCombo.setCurrentText("snapkv")
    assert controls.config()["per_head"] is False  # the user's choice, not the one adakv forced


def test_per_head_is_unchanged_after_snapkv_tova_snapkv(qtbot):
    """Issue 37: tova forced Per-head off and snapkv came back with it off, changing the result unseen."""
    controls = _controls(qtbot)
    controls.set_config({"method": "snapkv", "per_head": True})
    controls.methodCombo.setCurrentText("tova")
    assert controls.config()["per_head"] is False and not controls.perHeadCheck.isEnabled()
    assert "tova keeps the same positions" in controls.perHeadCheck.toolTip()
    controls.methodCombo.setCurrentText("snapkv")
    assert controls.config()["per_head"] is True and controls.perHeadCheck.isEnabled()
