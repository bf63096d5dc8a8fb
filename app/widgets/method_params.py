"""A method's or a quantization scheme's parameters as spin boxes (a combo box for a named choice), built from its
declaration (`kvcore.declared.param`).

A new method's or scheme's fields appear here with their defaults and help, with no widget code to write. Values are
kept by parameter name across changes, so a window set for snapkv carries over to pyramidkv, a seed set for rotated
to turboquant.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QFormLayout, QLabel, QSpinBox, QWidget

from kvcore.declared import Parameter

#: The largest value a spin box offers where a parameter declares no maximum.
_NO_MAXIMUM = 1 << 20

ParameterWidget = QSpinBox | QDoubleSpinBox | QComboBox


class MethodParameters(QWidget):
    """One row a parameter; emits `changed` when the user edits a value. `prefix` starts the widgets' object names
    (a second instance, the scheme's, keeps its names apart: "quantSeedSpin" beside the method's "seedSpin")."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None, prefix: str = "") -> None:
        super().__init__(parent)
        self.setObjectName(f"{prefix}Parameters" if prefix else "methodParameters")
        self._prefix = prefix
        self._form = QFormLayout(self)
        self._form.setContentsMargins(0, 0, 0, 0)
        self._spins: dict[str, ParameterWidget] = {}
        self._values: dict[str, int | float] = {}
        self._none = QLabel("none", objectName="noParametersLabel")
        self._none.setToolTip("This method has no parameters")

    def show_parameters(self, parameters: tuple[Parameter, ...]) -> None:
        """Rebuild the rows for `parameters`, each at its last value (its declared default at first)."""
        while self._form.rowCount():
            self._form.removeRow(0)
        self._none = QLabel("none", objectName="noParametersLabel")
        self._spins = {}
        for p in parameters:
            if (
                p.kind is tuple
            ):  # a list (one number per layer) has no spin box: its value is kept, set by --param
                self._values.setdefault(p.name, p.default)
                continue
            widget = self._widget(p)
            value = self._values.setdefault(p.name, p.default)
            if isinstance(widget, QComboBox):
                widget.setCurrentIndex(int(value))
                widget.currentIndexChanged.connect(lambda value, name=p.name: self._edited(name, value))
            else:
                widget.setValue(value)
                widget.valueChanged.connect(lambda value, name=p.name: self._edited(name, value))
            self._spins[p.name] = widget
            self._form.addRow(_label(p), widget)
        if not parameters:
            self._form.addRow("", self._none)

    def label(self, name: str) -> QLabel | None:
        """The shown label of parameter `name`, or None."""
        widget = self._spins.get(name)
        label = None if widget is None else self._form.labelForField(widget)
        return label if isinstance(label, QLabel) else None

    def values(self) -> dict[str, int | float]:
        """Every value set so far, by parameter name (the shown method's and the ones before it)."""
        return dict(self._values)

    def set_values(self, values: dict[str, int | float]) -> None:
        """Set values by name without emitting `changed` (the caller emits once)."""
        self._values.update(values)
        for name, value in values.items():
            widget = self._spins.get(name)
            if widget is not None:
                widget.blockSignals(True)
                if isinstance(widget, QComboBox):
                    widget.setCurrentIndex(int(value))
                else:
                    widget.setValue(value)
                widget.blockSignals(False)

    def spin(self, name: str) -> ParameterWidget | None:
        """The shown widget of parameter `name` (a combo box for a named choice), or None when there is none."""
        return self._spins.get(name)

    def _edited(self, name: str, value: int | float) -> None:
        self._values[name] = value
        self.changed.emit()

    def _name(self, p: Parameter, kind: str) -> str:
        if not self._prefix:
            return f"{p.name}{kind}"
        return self._prefix + "".join(w.capitalize() for w in p.name.split("_")) + kind

    def _widget(self, p: Parameter) -> ParameterWidget:
        if p.choices:
            combo = QComboBox(objectName=self._name(p, "Combo"))
            combo.addItems(list(p.choices))
            combo.setToolTip(f"{p.help} (default {p.choices[int(p.default)]})")
            return combo
        top = _NO_MAXIMUM if p.maximum is None else p.maximum
        if p.kind is float:
            spin = QDoubleSpinBox(objectName=self._name(p, "Spin"))
            spin.setDecimals(3)
            spin.setSingleStep(0.05)
            spin.setRange(-float(_NO_MAXIMUM) if p.minimum is None else p.minimum, top)
        else:
            spin = QSpinBox(objectName=self._name(p, "Spin"))
            spin.setRange(-_NO_MAXIMUM if p.minimum is None else int(p.minimum), int(top))
            spin.setSingleStep(2 if p.odd else 1)
        spin.setToolTip(f"{p.help} (default {p.default:g})")
        return spin


def _label(p: Parameter) -> QLabel:
    """The parameter's name as the CLI spells it, free to wrap after each underscore: a long name
    (key_channel_compression_ratio) takes two lines instead of pushing its spin box out of the panel."""
    label = QLabel(p.name.replace("_", "_\u200b"), objectName=f"{p.name}Label")
    label.setWordWrap(True)
    label.setToolTip(p.help)
    return label
