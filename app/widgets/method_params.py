"""The selected method's parameters as spin boxes, built from its declaration (`kvcore.declared.param`).

A new method's fields appear here with their defaults and help, with no widget code to write. Values are kept by
parameter name across method changes, so a window set for snapkv carries over to pyramidkv.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDoubleSpinBox, QFormLayout, QLabel, QSpinBox, QWidget

from kvcore.methods import Parameter

#: The largest value a spin box offers where a parameter declares no maximum.
_NO_MAXIMUM = 1 << 20


class MethodParameters(QWidget):
    """One row a parameter; emits `changed` when the user edits a value."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("methodParameters")
        self._form = QFormLayout(self)
        self._form.setContentsMargins(0, 0, 0, 0)
        self._spins: dict[str, QSpinBox | QDoubleSpinBox] = {}
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
            spin = self._spin(p)
            spin.setValue(self._values.setdefault(p.name, p.default))
            spin.valueChanged.connect(lambda value, name=p.name: self._edited(name, value))
            self._spins[p.name] = spin
            self._form.addRow(p.name, spin)
        if not parameters:
            self._form.addRow("", self._none)

    def values(self) -> dict[str, int | float]:
        """Every value set so far, by parameter name (the shown method's and the ones before it)."""
        return dict(self._values)

    def set_values(self, values: dict[str, int | float]) -> None:
        """Set values by name without emitting `changed` (the caller emits once)."""
        self._values.update(values)
        for name, value in values.items():
            spin = self._spins.get(name)
            if spin is not None:
                spin.blockSignals(True)
                spin.setValue(value)
                spin.blockSignals(False)

    def spin(self, name: str) -> QSpinBox | QDoubleSpinBox | None:
        """The shown spin box of parameter `name`, or None when the method has no such parameter."""
        return self._spins.get(name)

    def _edited(self, name: str, value: int | float) -> None:
        self._values[name] = value
        self.changed.emit()

    @staticmethod
    def _spin(p: Parameter) -> QSpinBox | QDoubleSpinBox:
        top = _NO_MAXIMUM if p.maximum is None else p.maximum
        if p.kind is float:
            spin = QDoubleSpinBox(objectName=f"{p.name}Spin")
            spin.setDecimals(3)
            spin.setSingleStep(0.05)
            spin.setRange(-float(_NO_MAXIMUM) if p.minimum is None else p.minimum, top)
        else:
            spin = QSpinBox(objectName=f"{p.name}Spin")
            spin.setRange(-_NO_MAXIMUM if p.minimum is None else int(p.minimum), int(top))
            spin.setSingleStep(2 if p.odd else 1)
        spin.setToolTip(f"{p.help} (default {p.default:g})")
        return spin
