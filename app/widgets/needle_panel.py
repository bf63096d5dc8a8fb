"""The Needle grid dock's widget: which probes (family, seed, depths, lengths) and which caches (methods, ratios,
bits), Run / Cancel, progress, the grid and its exports. app.controllers.needle_grid runs it on the engine thread."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.widgets.method_list import MethodChecklist, RunPanel
from app.widgets.needle_grid import NeedleGridView
from kvcore.defaults import (
    DEFAULT_PROBE_DEPTHS,
    DEFAULT_PROBE_FAMILY,
    DEFAULT_PROBE_LENGTHS,
    DEFAULT_PROBE_METHODS,
    DEFAULT_PROBE_RATIOS,
    DEFAULT_PROBE_SEED,
    UNQUANTIZED_BITS,
)
from kvcore.methods import available
from kvcore.probes import FAMILIES, HELDOUT_FAMILIES


def _csv(values) -> str:  # noqa: ANN001
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


class NeedlePanel(RunPanel):
    """Emits runRequested / cancelRequested / exportCsvRequested / exportImageRequested."""

    exportImageRequested = Signal()  # noqa: N815 (Qt signal naming)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("needlePanel")
        self.familyCombo = QComboBox(objectName="needleFamilyCombo")
        for name in FAMILIES:
            held = " (held out of training)" if name in HELDOUT_FAMILIES else ""
            self.familyCombo.addItem(name + held, name)
        self.familyCombo.setCurrentIndex(self.familyCombo.findData(DEFAULT_PROBE_FAMILY))
        self.seedSpin = QSpinBox(objectName="needleSeedSpin")
        self.seedSpin.setRange(0, 1_000_000)
        self.seedSpin.setValue(DEFAULT_PROBE_SEED)
        self.depthsEdit = QLineEdit(_csv(DEFAULT_PROBE_DEPTHS), objectName="needleDepthsEdit")
        self.depthsEdit.setToolTip(
            "Needle depths in [0, 1]: 0 = the start of the prompt, 1 = just before the question"
        )
        self.lengthsEdit = QLineEdit(_csv(DEFAULT_PROBE_LENGTHS), objectName="needleLengthsEdit")
        self.lengthsEdit.setToolTip("Prompt lengths in tokens (at least 64)")
        self.methodsList = MethodChecklist(list(available()), DEFAULT_PROBE_METHODS, "needleMethodsList")
        self.ratiosEdit = QLineEdit(_csv(DEFAULT_PROBE_RATIOS), objectName="needleRatiosEdit")
        self.bitsEdit = QLineEdit(str(UNQUANTIZED_BITS), objectName="needleBitsEdit")
        self.exportImageButton = QPushButton("Export image…", objectName="needleExportImageButton")
        self.exportImageButton.clicked.connect(self.exportImageRequested)
        self.grid = NeedleGridView()
        rows = [
            ("Family", self.familyCombo),
            ("Seed", self.seedSpin),
            ("Depths", self.depthsEdit),
            ("Lengths", self.lengthsEdit),
            ("Methods", self.methodsList),
            ("Ratios", self.ratiosEdit),
            ("Bits", self.bitsEdit),
        ]
        csv_tip = "Save every (probe, cache) row with the columns of `kvlens probe --csv`"
        self.statusLabel = self._build(
            "needle", "Run grid", csv_tip, rows, [self.exportImageButton], self.grid
        )
        self.statusLabel.setObjectName("needleStatusLabel")

    def family(self) -> str:
        return self.familyCombo.currentData()

    def set_family(self, name: str) -> None:
        self.familyCombo.setCurrentIndex(self.familyCombo.findData(name))

    def set_running(self, running: bool, total: int = 0) -> None:
        self._set_running(running, total, self.statusLabel, f"0 of {total} probes")
