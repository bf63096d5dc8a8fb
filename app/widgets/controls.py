"""Compression controls: method, retention ratio, quantization and method parameters as one config dict.

The method list, the parameter rows and which choices a method fixes come from the methods' declarations
(`kvcore.methods`), so a new method file shows up here with its own widgets; the quantization schemes, the widths
and group sizes each allows, from theirs (`kvcore.quant`).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QSlider,
    QSpinBox,
    QWidget,
)

from app.widgets.method_params import MethodParameters
from app.widgets.method_tip import method_tip
from kvcore.defaults import (
    ALLOWED_BITS,
    ALLOWED_GROUP_SIZES,
    DEFAULT_CONFIG,
    DEFAULT_EDGE_BITS,
    DEFAULT_SPLIT_VALUE_BITS,
    SCHEDULE_HELP,
    SCHEDULES,
    UNQUANTIZED_BITS,
    bits_or_none,
)
from kvcore.methods import Method, available
from kvcore.methods import get as get_method
from kvcore.quant import QuantScheme, parse_spec
from kvcore.quant import available as available_schemes
from kvcore.quant import get as get_scheme

BITS_STEPS = (*ALLOWED_BITS, UNQUANTIZED_BITS)
GROUP_SIZES = ALLOWED_GROUP_SIZES
DEFAULTS: dict[str, Any] = dict(DEFAULT_CONFIG)
#: Method parameters that are fields of the config dict itself (the rest travel in its "params").
_TOP_LEVEL = ("window", "n_sink", "kernel")
_DISABLED_ITEM = Qt.ItemFlag.NoItemFlags
_ENABLED_ITEM = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
_FLAGS_ROLE = Qt.ItemDataRole.UserRole - 1  # where QStandardItemModel keeps an item's flags


class CompressionControls(QWidget):
    """Emits `configChanged(dict)` on every user or programmatic change; coalescing is the caller's job."""

    configChanged = Signal(dict)  # noqa: N815 (Qt signal naming)

    def __init__(self, methods: list[str] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("compressionControls")
        self._head_dim: int | None = None
        self._baseline = ""  # the dense cache's element type, once a model is loaded
        self._value_dim: int | None = None
        self._per_head_choice = bool(DEFAULTS["per_head"])  # the user's, kept while a method forces the box
        self._build_ui(methods or list(available()))
        self.set_config(DEFAULTS)

    def _build_ui(self, methods: list[str]) -> None:
        self.methodCombo = QComboBox(objectName="methodCombo")
        self.methodCombo.addItems(methods)
        for i, name in enumerate(methods):
            self.methodCombo.setItemData(i, method_tip(name), Qt.ItemDataRole.ToolTipRole)
        self.methodCombo.setToolTip("Which positions each kv-head keeps")
        # The longest names (per_layer_compression-non_causal_attention) would widen the panel past its column:
        # the box keeps a readable width and the list opens as wide as its names.
        self.methodCombo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.methodCombo.setMinimumContentsLength(12)
        self.methodCombo.view().setMinimumWidth(self.methodCombo.view().sizeHintForColumn(0) + 24)

        self.retentionSlider = QSlider(Qt.Orientation.Horizontal, objectName="retentionSlider")
        self.retentionSlider.setRange(1, 100)
        self.retentionSlider.setPageStep(5)
        self.retentionLabel = QLabel(objectName="retentionLabel")
        self.retentionLabel.setMinimumWidth(40)

        self.bitsSlider = QSlider(Qt.Orientation.Horizontal, objectName="bitsSlider")
        self.bitsSlider.setRange(0, len(BITS_STEPS) - 1)
        self.bitsSlider.setPageStep(1)
        self.bitsSlider.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.bitsSlider.setToolTip("Bits per stored K/V value (the keys' when split); 16 means not quantized")
        self._bits_index = self.bitsSlider.value()  # where the slider was: a width a scheme lacks is skipped
        self.quantCombo = QComboBox(objectName="quantCombo")
        for i, name in enumerate(available_schemes()):
            self.quantCombo.addItem(name, name)
            self.quantCombo.setItemData(i, _scheme_tip(get_scheme(name)), Qt.ItemDataRole.ToolTipRole)
        self.quantCombo.setToolTip("The quantization scheme that packs K and V (kvcore.quant)")
        self.quantParameters = MethodParameters(prefix="quant")
        self.quantParameters.setToolTip("The scheme's own parameters, from its declaration (kvcore.quant)")
        self.edgeLayersSpin = self._spin(
            "edgeLayersSpin",
            0,
            1 << 10,
            "Layer-adaptive widths: the first and last K layers packed at the edge width (the layers nearest the "
            "embeddings and the logits are the most sensitive). off: every layer at the Bits width",
        )
        self.edgeLayersSpin.setSpecialValueText("off")
        self.edgeBitsSpin = self._spin(
            "edgeBitsSpin", min(ALLOWED_BITS), max(ALLOWED_BITS), "Width of the edge layers"
        )
        self.edgeBitsSpin.setValue(DEFAULT_EDGE_BITS)
        self.edgeBitsSpin.setSuffix("-bit")
        self._edge_bits = DEFAULT_EDGE_BITS  # where the edge spin was: a width the scheme lacks is skipped
        self._layer_bits: tuple[
            int, ...
        ] = ()  # a width per layer from a file or a sweep: carried, not edited
        self.edgeRow = QWidget(objectName="edgeRow")
        edge = QHBoxLayout(self.edgeRow)
        edge.setContentsMargins(0, 0, 0, 0)
        edge.addWidget(self.edgeLayersSpin, 1)
        edge.addWidget(QLabel("at"))
        edge.addWidget(self.edgeBitsSpin, 1)
        self.bitsLabel = QLabel(objectName="bitsLabel")
        self.bitsLabel.setMinimumWidth(40)
        self.splitBitsCheck = QCheckBox("Separate K/V", objectName="splitBitsCheck")
        self.splitBitsCheck.setToolTip(
            "Pack values at their own width: keys carry outlier channels, values do not, so 8-bit keys with "
            "4-bit values costs little quality; either side may stay unquantized (16)"
        )
        self.valueBitsSlider = QSlider(Qt.Orientation.Horizontal, objectName="valueBitsSlider")
        self.valueBitsSlider.setRange(0, len(BITS_STEPS) - 1)
        self.valueBitsSlider.setPageStep(1)
        self.valueBitsSlider.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.valueBitsSlider.setToolTip(
            "Bits per stored value (keys use the Bits slider); 16 means not quantized"
        )
        self.valueBitsSlider.setValue(BITS_STEPS.index(DEFAULT_SPLIT_VALUE_BITS))
        self.valueBitsLabel = QLabel(objectName="valueBitsLabel")
        self.valueBitsLabel.setMinimumWidth(40)
        self.valueBitsRow = self._with_label(self.valueBitsSlider, self.valueBitsLabel)

        self.fpRecentSpin = self._spin(
            "fpRecentSpin",
            0,
            1 << 20,
            "Full-precision residual: keep the kept sinks and the last R prompt positions unquantized beside "
            "the packed rest, and every generated token too (KIVI-style); the quantization-error view shows 0 "
            "there. 0: pack everything kept",
        )
        self.fpRecentSpin.setSpecialValueText("off")
        self.fpRecentSpin.setSingleStep(16)

        self.groupSizeCombo = QComboBox(objectName="groupSizeCombo")
        for size in GROUP_SIZES:
            self.groupSizeCombo.addItem(str(size), size)
        self.perHeadCheck = QCheckBox("Per-head selection", objectName="perHeadCheck")
        self.perHeadCheck.setToolTip("Each kv-head keeps its own positions (off: all heads share one set)")

        self.methodParameters = MethodParameters()
        self.methodParameters.set_values({name: DEFAULTS[name] for name in _TOP_LEVEL})
        self.scheduleCombo = QComboBox(objectName="scheduleCombo")
        for i, name in enumerate(SCHEDULES):
            self.scheduleCombo.addItem(name, name)
            self.scheduleCombo.setItemData(i, SCHEDULE_HELP[name], Qt.ItemDataRole.ToolTipRole)
        self.scheduleCombo.setToolTip(
            "When the prompt is compressed.\n" + "\n".join(f"{k}: {v}." for k, v in SCHEDULE_HELP.items())
        )
        self.autoRegenerateCheck = QCheckBox("Auto-regenerate", objectName="autoRegenerateCheck")
        self.autoRegenerateCheck.setChecked(True)
        self.autoRegenerateCheck.setToolTip("Regenerate and compare the continuations after every change")
        self.budgetNoteLabel = QLabel(objectName="budgetNoteLabel", wordWrap=True)
        self.budgetNoteLabel.setToolTip("The method's per-layer budget rule does not apply at this setting")
        self.budgetNoteLabel.hide()

        form = QFormLayout(self)
        form.addRow("Method", self.methodCombo)
        form.addRow("Retention", self._with_label(self.retentionSlider, self.retentionLabel))
        form.addRow("Quantization", self.quantCombo)
        form.addRow("", self.quantParameters)
        form.addRow("Bits", self._with_label(self.bitsSlider, self.bitsLabel))
        form.addRow("Edge layers", self.edgeRow)
        form.addRow("", self.splitBitsCheck)
        form.addRow("Value bits", self.valueBitsRow)
        form.addRow("FP recent", self.fpRecentSpin)
        self._form = form
        form.addRow("Group size", self.groupSizeCombo)
        form.addRow("", self.perHeadCheck)
        form.addRow("Parameters", self.methodParameters)
        form.addRow("Schedule", self.scheduleCombo)
        form.addRow("", self.autoRegenerateCheck)
        form.addRow(self.budgetNoteLabel)  # both columns wide: the note is not clipped

        self.methodCombo.currentIndexChanged.connect(self._method_changed)
        self.retentionSlider.valueChanged.connect(self._changed)
        self.quantCombo.currentIndexChanged.connect(self._scheme_changed)
        self.quantParameters.changed.connect(self._changed)
        self.edgeLayersSpin.valueChanged.connect(self._edge_layers_changed)
        self.edgeBitsSpin.valueChanged.connect(self._changed)
        self.bitsSlider.valueChanged.connect(self._changed)
        self.splitBitsCheck.toggled.connect(self._changed)
        self.valueBitsSlider.valueChanged.connect(self._changed)
        self.groupSizeCombo.currentIndexChanged.connect(self._changed)
        self.perHeadCheck.toggled.connect(self._per_head_toggled)
        self.scheduleCombo.currentIndexChanged.connect(self._changed)
        self.fpRecentSpin.valueChanged.connect(self._changed)
        self.methodParameters.changed.connect(self._changed)
        self._show_method_parameters()
        self._show_scheme_parameters()

    @staticmethod
    def _spin(name: str, lo: int, hi: int, tip: str) -> QSpinBox:
        spin = QSpinBox(objectName=name)
        spin.setRange(lo, hi)
        spin.setToolTip(tip)
        return spin

    @staticmethod
    def _with_label(slider: QSlider, label: QLabel) -> QWidget:
        box = QWidget()
        row = QHBoxLayout(box)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(slider, 1)
        row.addWidget(label)
        return box

    # -- public API -------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """{method, ratio (0.01-1.0), bits (int, None = unquantized keys), value_bits (None = the keys' width,
        16 = unquantized values), fp_recent (0 when nothing is packed),
        group_size (the scheme's own where it fixes one), per_head, window, n_sink, kernel, schedule, params (the
        method's other parameters), quant (the scheme's spec, its parameters in it: "rotated:packing=mxfp4"),
        edge_layers and edge_bits only while edge layers are on (as `CompressionConfig.to_dict`)}."""
        bits = BITS_STEPS[self.bitsSlider.value()]
        values = self.methodParameters.values()
        groups = self.scheme().allowed_group_sizes
        declared = [p.name for p in self.method().parameters()]
        return {
            "method": self.methodCombo.currentText(),
            "ratio": self.retentionSlider.value() / 100.0,
            "bits": bits_or_none(bits),
            "value_bits": self._value_bits(bits),
            "fp_recent": self.fpRecentSpin.value() if self._fp_recent_applies() else 0,
            "group_size": groups[0] if len(groups) == 1 else int(self.groupSizeCombo.currentData()),
            "per_head": self.perHeadCheck.isChecked(),
            "window": values["window"],
            "n_sink": values["n_sink"],
            "kernel": values["kernel"],
            "schedule": self.scheduleCombo.currentData(),
            "params": {name: values[name] for name in declared if name not in _TOP_LEVEL},
            "quant": self.scheme_spec(),
            **self._edges(),
        }

    def set_config(self, config: dict[str, Any]) -> None:
        """Apply the keys present in `config` (others keep their value); emits configChanged once."""
        widgets = (
            self.methodCombo,
            self.quantCombo,
            self.retentionSlider,
            self.bitsSlider,
            self.splitBitsCheck,
            self.valueBitsSlider,
            self.groupSizeCombo,
            self.perHeadCheck,
            self.fpRecentSpin,
            self.scheduleCombo,
            self.edgeLayersSpin,
            self.edgeBitsSpin,
        )
        for w in widgets:
            w.blockSignals(True)
        try:
            if "method" in config and self.methodCombo.findText(config["method"]) >= 0:
                self.methodCombo.setCurrentIndex(self.methodCombo.findText(config["method"]))
                self._show_method_parameters()
            if "quant" in config:
                name, scheme_values = parse_spec(config["quant"])  # one line naming the schemes or parameters
                self.quantCombo.setCurrentIndex(self.quantCombo.findData(name))
                self._show_scheme_parameters()
                defaults = {p.name: p.default for p in self.scheme().parameters() if p.name != "group_size"}
                self.quantParameters.set_values({**defaults, **scheme_values})
                # the layer widths belong to the quantization: a dict naming the scheme without them has none
                self.edgeLayersSpin.setValue(int(config.get("edge_layers", 0)))
                self._layer_bits = tuple(int(b) for b in config.get("layer_bits") or ())
            elif "edge_layers" in config or "layer_bits" in config:
                self.edgeLayersSpin.setValue(int(config.get("edge_layers", 0)))
                self._layer_bits = tuple(int(b) for b in config.get("layer_bits") or ())
            if "edge_bits" in config:
                self.edgeBitsSpin.setValue(int(config["edge_bits"]))
                self._edge_bits = self.edgeBitsSpin.value()
            if "ratio" in config:
                self.retentionSlider.setValue(round(float(config["ratio"]) * 100))
            if "bits" in config:
                bits = UNQUANTIZED_BITS if config["bits"] in (None, UNQUANTIZED_BITS) else int(config["bits"])
                if bits not in BITS_STEPS:
                    raise ValueError(f"bits must be one of {BITS_STEPS}, got {bits}")
                self.bitsSlider.setValue(BITS_STEPS.index(bits))
                self._bits_index = self.bitsSlider.value()
            if "value_bits" in config:
                value_bits = config["value_bits"]
                split = value_bits not in (None, BITS_STEPS[self.bitsSlider.value()])
                if split and value_bits not in BITS_STEPS:
                    raise ValueError(f"value_bits must be one of {BITS_STEPS}, got {value_bits}")
                if split:
                    self.valueBitsSlider.setValue(BITS_STEPS.index(int(value_bits)))
                self.splitBitsCheck.setChecked(split)
            if "group_size" in config:
                index = self.groupSizeCombo.findData(int(config["group_size"]))
                if index < 0:
                    raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {config['group_size']}")
                self.groupSizeCombo.setCurrentIndex(index)
            if "schedule" in config:
                index = self.scheduleCombo.findData(config["schedule"])
                if index < 0:
                    raise ValueError(
                        f"schedule must be one of {', '.join(SCHEDULES)}, got {config['schedule']!r}"
                    )
                self.scheduleCombo.setCurrentIndex(index)
            if "per_head" in config:
                self._per_head_choice = bool(config["per_head"])
                self.perHeadCheck.setChecked(self._per_head_choice)
            if "fp_recent" in config:
                self.fpRecentSpin.setValue(int(config["fp_recent"]))
            values = {k: int(config[k]) for k in _TOP_LEVEL if k in config}
            self.methodParameters.set_values({**values, **dict(config.get("params") or {})})
        finally:
            for w in widgets:
                w.blockSignals(False)
        self._changed()

    def method(self) -> Method:
        """The selected method, as declared (its parameters at their defaults)."""
        return get_method(self.methodCombo.currentText())

    def scheme(self) -> QuantScheme:
        """The selected quantization scheme with its shown parameters (rotated's packing sets the widths)."""
        return get_scheme(self.scheme_spec())

    def scheme_spec(self) -> str:
        """The selected scheme with its shown parameters, as `kvcore.quant.get` takes it ("rotated:packing=mxfp4")."""
        name = self.quantCombo.currentData()
        values = self.quantParameters.values()
        own = {
            p.name: values[p.name]
            for p in get_scheme(name).parameters()
            if p.name in values and p.name != "group_size"  # the caches carry the group on their own
        }
        return get_scheme(name, **own).spec

    def quantized(self) -> bool:
        """Whether the current choice packs keys or values (or both)."""
        bits = BITS_STEPS[self.bitsSlider.value()]
        return bits != UNQUANTIZED_BITS or self._value_bits(bits) not in (None, UNQUANTIZED_BITS)

    def set_head_dim(self, head_dim: int | None, value_dim: int | None = None) -> None:
        """Disable group sizes that do not divide the model's head_dim, or its value width (default head_dim;
        deepseek_v2's is narrower) while values are packed: mx.quantize would raise."""
        self._head_dim, self._value_dim = head_dim, value_dim or head_dim
        self._changed()

    def set_baseline(self, dtype: str) -> None:
        """Name what an unquantized side stores (the model's cache dtype: float32 on MLX's CPU, bfloat16 on a
        Mac), so "off" never hides a float32 baseline behind a "16"."""
        self._baseline = dtype
        self._update_labels()

    def set_budget_note(self, note: str | None) -> None:
        """Show why the last result's budget rule fell back to uniform counts (pyramidkv); hide when it did not."""
        self.budgetNoteLabel.setText(f"⚠ {note}" if note else "")
        self.budgetNoteLabel.setVisible(bool(note))

    def auto_regenerate(self) -> bool:
        """Whether a change should also regenerate the continuations."""
        return self.autoRegenerateCheck.isChecked()

    # -- internals --------------------------------------------------------------------------------

    def _method_changed(self) -> None:
        self._show_method_parameters()
        self._changed()

    def _show_method_parameters(self) -> None:
        self.methodParameters.show_parameters(self.method().parameters())

    def _scheme_changed(self) -> None:
        self._show_scheme_parameters()
        self._changed()

    def _show_scheme_parameters(self) -> None:
        """The scheme's parameters but its group size (which has its own row); the row hidden when none."""
        shown = tuple(p for p in self.scheme().parameters() if p.name != "group_size")
        self.quantParameters.show_parameters(shown)
        self._form.setRowVisible(self.quantParameters, bool(shown))

    def _fp_recent_applies(self) -> bool:
        """A float residual beside packed rows; a scheme keeping its own (kivi's `residual`) takes none."""
        return self.quantized() and not self.scheme().per_channel_keys

    def _edges(self) -> dict[str, Any]:
        """edge_layers and edge_bits while edge layers are on and something is packed, or the carried width per
        layer; {} otherwise (every layer alike)."""
        if not self.quantized():
            return {}
        if self.edgeLayersSpin.value():
            return {"edge_layers": self.edgeLayersSpin.value(), "edge_bits": self.edgeBitsSpin.value()}
        return {"layer_bits": list(self._layer_bits)} if self._layer_bits else {}

    def _edge_layers_changed(self) -> None:
        self._layer_bits = ()  # edge layers set by hand replace a width per layer
        self._changed()

    def _per_head_toggled(self, checked: bool) -> None:
        self._per_head_choice = checked
        self._changed()

    def _changed(self) -> None:
        self._update_validity()
        self._update_labels()
        self.configChanged.emit(self.config())

    def _value_bits(self, key_bits: int) -> int | None:
        """The values' width (16: unquantized) when split at another width than the keys'; None otherwise."""
        if not self.splitBitsCheck.isChecked():
            return None
        value_bits = BITS_STEPS[self.valueBitsSlider.value()]
        return None if value_bits == key_bits else value_bits

    def _update_labels(self) -> None:
        self.retentionLabel.setText(f"{self.retentionSlider.value()} %")
        self.bitsLabel.setText(self._width_text(BITS_STEPS[self.bitsSlider.value()]))
        self.valueBitsLabel.setText(self._width_text(BITS_STEPS[self.valueBitsSlider.value()]))

    def _width_text(self, bits: int) -> str:
        if bits != UNQUANTIZED_BITS:
            return f"{bits}-bit"
        return f"off ({self._baseline})" if self._baseline else f"{bits} (off)"

    def _update_validity(self) -> None:
        """Grey out what the current choice makes meaningless or invalid, and say why."""
        method = self.method()
        self._enable(self.retentionSlider, not method.keeps_everything, f"{method.name} keeps every position")
        forced = _forced_per_head(method)
        self._enable(self.perHeadCheck, forced is None, forced[1] if forced else "")
        wanted = self._per_head_choice if forced is None else forced[0]
        if self.perHeadCheck.isChecked() != wanted:
            self.perHeadCheck.blockSignals(True)
            self.perHeadCheck.setChecked(wanted)
            self.perHeadCheck.blockSignals(False)

        scheme = self.scheme()
        self._snap_to_scheme(scheme)
        groups = scheme.allowed_group_sizes
        if not self.quantized():
            self._enable(self.groupSizeCombo, False, "No quantization at 16 bits")
        else:
            self._enable(
                self.groupSizeCombo, len(groups) > 1, f"{scheme.name} fixes its group size: {groups[0]}"
            )
        self._enable(
            self.fpRecentSpin,
            self._fp_recent_applies(),
            f"{scheme.name} keeps its own float residual: its residual parameter"
            if scheme.per_channel_keys
            else "No quantization at 16 bits: everything is float",
        )
        self._enable(
            self.edgeLayersSpin, self.quantized(), "No quantization at 16 bits: no layer has a width"
        )
        if self._layer_bits and self.edgeLayersSpin.isEnabledTo(self):
            self.edgeLayersSpin.setToolTip(
                f"A width per layer is set ({','.join(map(str, self._layer_bits))}): edge layers replace it"
            )
        self._enable(
            self.edgeBitsSpin,
            self.quantized() and self.edgeLayersSpin.value() > 0,
            "Edge layers off: every layer at the Bits width",
        )
        self._form.setRowVisible(self.valueBitsRow, self.splitBitsCheck.isChecked())
        self._update_group_sizes()

    def _snap_to_scheme(self, scheme: QuantScheme) -> None:
        """Skip the widths the scheme does not pack (in the direction the slider moved) and say why in the
        sliders' tooltips: a slider cannot grey one of its steps."""
        allowed = [i for i, b in enumerate(BITS_STEPS) if b in scheme.allowed_bits or b == UNQUANTIZED_BITS]
        for slider in (self.bitsSlider, self.valueBitsSlider):
            here = slider.value()
            if here not in allowed:
                before = self._bits_index if slider is self.bitsSlider else here
                ahead = [i for i in allowed if (i > here if here >= before else i < here)]
                target = min(ahead or allowed, key=lambda i: abs(i - here))
                slider.blockSignals(True)
                slider.setValue(target)
                slider.blockSignals(False)
            left_out = [b for b in ALLOWED_BITS if b not in scheme.allowed_bits]
            base = slider.property("baseToolTip") or slider.toolTip()
            slider.setProperty("baseToolTip", base)
            reason = (
                f"\n{scheme.name} packs {', '.join(map(str, scheme.allowed_bits))} bits only"
                if left_out
                else ""
            )
            slider.setToolTip(base + reason)
        self._bits_index = self.bitsSlider.value()
        self._snap_edge_bits(scheme)

    def _snap_edge_bits(self, scheme: QuantScheme) -> None:
        """Keep the edge width one the scheme packs, stepping past the others in the direction it moved."""
        spin, allowed = self.edgeBitsSpin, [b for b in scheme.allowed_bits if b in ALLOWED_BITS]
        here = spin.value()
        if here not in allowed and allowed:
            ahead = [b for b in allowed if (b > here if here >= self._edge_bits else b < here)]
            spin.blockSignals(True)
            spin.setValue(min(ahead or allowed, key=lambda b: abs(b - here)))
            spin.blockSignals(False)
        self._edge_bits = spin.value()

    def _update_group_sizes(self) -> None:
        combo = self.groupSizeCombo
        bits = BITS_STEPS[self.bitsSlider.value()]
        value_bits = self._value_bits(bits) or bits
        values_packed = value_bits != UNQUANTIZED_BITS
        widths = [("head_dim", self._head_dim)] if bits != UNQUANTIZED_BITS or not values_packed else []
        widths += [("value width", self._value_dim)] if values_packed else []
        valid = []
        for i, size in enumerate(GROUP_SIZES):
            misfit = next(((name, dim) for name, dim in widths if dim is not None and dim % size), None)
            ok = misfit is None
            reason = "" if ok else f"{misfit[0]} {misfit[1]} is not divisible by group size {size}"
            if combo.itemData(i, _FLAGS_ROLE) != (_ENABLED_ITEM if ok else _DISABLED_ITEM):
                combo.setItemData(i, _ENABLED_ITEM if ok else _DISABLED_ITEM, _FLAGS_ROLE)
            combo.setItemData(i, reason, Qt.ItemDataRole.ToolTipRole)
            if ok:
                valid.append(i)
        if valid and combo.currentIndex() not in valid:
            combo.blockSignals(True)
            combo.setCurrentIndex(valid[-1])
            combo.blockSignals(False)

    @staticmethod
    def _enable(widget: QWidget, enabled: bool, reason: str) -> None:
        tip = widget.property("baseToolTip")
        if tip is None:
            tip = widget.toolTip()
            widget.setProperty("baseToolTip", tip)
        widget.setEnabled(enabled)
        widget.setToolTip(tip if enabled else reason)  # another disabling method brings its own reason


def _scheme_tip(scheme: QuantScheme) -> str:
    """The scheme's description, then its parameters other than the group (which has its own control)."""
    extra = [
        f"{p.name} = {getattr(scheme, p.name)}: {p.help}"
        for p in scheme.parameters()
        if p.name != "group_size"
    ]
    return "\n".join([scheme.description, *extra])


def _forced_per_head(method: Method) -> tuple[bool, str] | None:
    """(per_head, why the box is greyed) for a method that fixes the choice, from its declaration; else None."""
    if method.spreads_over_heads:
        return (
            True,
            f"{method.name} spreads each layer's budget over its kv-heads, so every head selects its own",
        )
    if method.shared_across_heads:
        return False, f"{method.name} keeps the same positions in every kv-head"
    return None
