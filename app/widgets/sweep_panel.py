"""The Sweep dock's widget: what to sweep (methods, ratios, bits, group size), Run / Cancel, progress, the
frontier plot and the CSV export. It only collects and shows; app.controllers.sweep runs the sweep on the engine."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtWidgets import (
    QComboBox,
    QLineEdit,
    QWidget,
)

from app.widgets.config_text import parse_bits
from app.widgets.controls import GROUP_SIZES
from app.widgets.frontier import FrontierPlot
from app.widgets.method_list import MethodChecklist, RunPanel
from kvcore.defaults import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_SWEEP_BITS,
    DEFAULT_SWEEP_METHODS,
    DEFAULT_SWEEP_RATIOS,
)
from kvcore.engine.sweep import parse_ratios
from kvcore.methods import available

#: The retention slider moves in whole percents; a swept ratio must be one so that clicking its point can set it.
RATIO_STEP = 0.01


@dataclass(frozen=True)
class SweepSpec:
    methods: list[str]
    ratios: list[float]
    bits: list[int]  # 16 = unquantized
    group_size: int

    @property
    def size(self) -> int:
        return len(self.methods) * len(self.ratios) * len(self.bits)


class SweepPanel(RunPanel):
    """Emits runRequested / cancelRequested / exportCsvRequested; the frontier plot emits pointClicked itself."""

    def __init__(self, methods: list[str] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sweepPanel")
        self.methodsList = MethodChecklist(
            methods or list(available()), DEFAULT_SWEEP_METHODS, "sweepMethodsList"
        )
        self.ratiosEdit = QLineEdit(",".join(map(str, DEFAULT_SWEEP_RATIOS)), objectName="sweepRatiosEdit")
        self.ratiosEdit.setToolTip(
            "Retention ratios: a list (0.1,0.25,0.5) or a range start:stop:step (0.1:0.9:0.1)"
        )
        self.bitsEdit = QLineEdit(",".join(map(str, DEFAULT_SWEEP_BITS)), objectName="sweepBitsEdit")
        self.bitsEdit.setToolTip("Bit widths, comma-separated; 16 = not quantized")
        self.groupSizeCombo = QComboBox(objectName="sweepGroupSizeCombo")
        for size in GROUP_SIZES:
            self.groupSizeCombo.addItem(str(size), size)
        self.groupSizeCombo.setCurrentIndex(self.groupSizeCombo.findData(DEFAULT_GROUP_SIZE))
        self.frontier = FrontierPlot()
        rows = [
            ("Methods", self.methodsList),
            ("Ratios", self.ratiosEdit),
            ("Bits", self.bitsEdit),
            ("Group size", self.groupSizeCombo),
        ]
        csv_tip = "Save the sweep with the columns of `kvlens sweep`"
        self.estimateLabel = self._build("sweep", "Run sweep", csv_tip, rows, [], self.frontier)
        self.estimateLabel.setObjectName("sweepEstimateLabel")
        self.progressBar.setRange(0, 1)
        self.progressBar.setValue(0)

    # -- input ------------------------------------------------------------------------------------

    def spec(self) -> SweepSpec:
        """What the user asked for; ValueError with the fix for anything the sweep cannot run."""
        methods = self.checked_methods()
        if not methods:
            raise ValueError("no method is ticked: tick at least one method to sweep")
        ratios = parse_ratios(self.ratiosEdit.text())
        off = [r for r in ratios if abs(r / RATIO_STEP - round(r / RATIO_STEP)) > 1e-6]
        if off:
            raise ValueError(f"ratio {off[0]:g} is finer than the retention slider's 1 %: use whole percents")
        ratios = [round(r, 2) for r in ratios]
        return SweepSpec(
            methods, ratios, parse_bits(self.bitsEdit.text()), int(self.groupSizeCombo.currentData())
        )

    # -- state ------------------------------------------------------------------------------------

    def set_running(self, running: bool, total: int = 0) -> None:
        self._set_running(
            running, total, self.estimateLabel, f"0 of {total} points; the time left shows after the first"
        )

    def show_progress(self, done: int, total: int, remaining_s: float | None) -> None:
        self.progressBar.setValue(done)
        left = "" if remaining_s is None else f", about {_duration(remaining_s)} left"
        self.estimateLabel.setText(f"{done} of {total} points{left}")

    def set_status(self, text: str) -> None:
        self.estimateLabel.setText(text)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
