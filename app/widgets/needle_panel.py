"""The Needle grid dock's widget: which probes (family, seed, depths, lengths) and which caches (methods, ratios,
bits), Run / Cancel, progress, the grid and its exports. app.needles runs it on the engine thread."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.widgets.controls import DEFAULT_METHODS
from app.widgets.method_list import MethodChecklist, run_layout
from app.widgets.needle_grid import NeedleGridView
from kvcore.defaults import (
    DEFAULT_PROBE_DEPTHS,
    DEFAULT_PROBE_LENGTHS,
    DEFAULT_PROBE_METHODS,
    DEFAULT_PROBE_RATIOS,
    UNQUANTIZED_BITS,
)
from kvcore.probes import FAMILIES, HELDOUT_FAMILIES


def _csv(values) -> str:  # noqa: ANN001
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


class NeedlePanel(QWidget):
    runRequested = Signal()  # noqa: N815 (Qt signal naming)
    cancelRequested = Signal()  # noqa: N815
    exportCsvRequested = Signal()  # noqa: N815
    exportImageRequested = Signal()  # noqa: N815

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("needlePanel")
        self.familyCombo = QComboBox(objectName="needleFamilyCombo")
        for name in FAMILIES:
            held = " (held out of training)" if name in HELDOUT_FAMILIES else ""
            self.familyCombo.addItem(name + held, name)
        self.familyCombo.setCurrentIndex(self.familyCombo.findData(HELDOUT_FAMILIES[0]))
        self.seedSpin = QSpinBox(objectName="needleSeedSpin")
        self.seedSpin.setRange(0, 1_000_000)
        self.depthsEdit = QLineEdit(_csv(DEFAULT_PROBE_DEPTHS), objectName="needleDepthsEdit")
        self.depthsEdit.setToolTip(
            "Needle depths in [0, 1]: 0 = the start of the prompt, 1 = just before the question"
        )
        self.lengthsEdit = QLineEdit(_csv(DEFAULT_PROBE_LENGTHS), objectName="needleLengthsEdit")
        self.lengthsEdit.setToolTip("Prompt lengths in tokens (at least 64)")
        self.methodsList = MethodChecklist(DEFAULT_METHODS, DEFAULT_PROBE_METHODS, "needleMethodsList")
        self.ratiosEdit = QLineEdit(_csv(DEFAULT_PROBE_RATIOS), objectName="needleRatiosEdit")
        self.bitsEdit = QLineEdit(str(UNQUANTIZED_BITS), objectName="needleBitsEdit")
        self.runButton = QPushButton("Run grid", objectName="needleRunButton")
        self.cancelButton = QPushButton("Cancel", objectName="needleCancelButton")
        self.cancelButton.setEnabled(False)
        self.progressBar = QProgressBar(objectName="needleProgressBar")
        self.statusLabel = QLabel("", objectName="needleStatusLabel")
        self.statusLabel.setWordWrap(True)
        self.exportCsvButton = QPushButton("Export CSV…", objectName="needleExportCsvButton")
        self.exportCsvButton.setToolTip(
            "Save every (probe, cache) row with the columns of `kvlens probe --csv`"
        )
        self.exportImageButton = QPushButton("Export image…", objectName="needleExportImageButton")
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
        run_layout(
            self,
            rows,
            self.runButton,
            self.cancelButton,
            self.progressBar,
            self.statusLabel,
            [self.exportImageButton, self.exportCsvButton],
            self.grid,
        )

        self.runButton.clicked.connect(self.runRequested)
        self.cancelButton.clicked.connect(self.cancelRequested)
        self.exportCsvButton.clicked.connect(self.exportCsvRequested)
        self.exportImageButton.clicked.connect(self.exportImageRequested)

    def family(self) -> str:
        return self.familyCombo.currentData()

    def set_family(self, name: str) -> None:
        self.familyCombo.setCurrentIndex(self.familyCombo.findData(name))

    def checked_methods(self) -> list[str]:
        return self.methodsList.checked()

    def set_methods(self, names: list[str]) -> None:
        self.methodsList.set_checked(names)

    def set_running(self, running: bool, total: int = 0) -> None:
        self.runButton.setEnabled(not running)
        self.cancelButton.setEnabled(running)
        if running:
            self.progressBar.setRange(0, max(total, 1))
            self.progressBar.setValue(0)
            self.statusLabel.setText(f"0 of {total} probes")
