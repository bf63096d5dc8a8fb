"""The "Stored form" dock: what a method that changes the stored rows did, beyond which positions it kept —
ThinK's kept key channels (app.widgets.channel_map) and merging's targets (app.widgets.merge_map), one tab each.
A compression whose method does either brings its tab to the front; the other tab says in one line why it is
empty."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QTabWidget, QWidget

from app.engine.view_model import CompressionView
from app.widgets.channel_map import ChannelMap
from app.widgets.merge_map import MergeMap

CHANNELS_TAB = "Key channels (ThinK)"
MERGES_TAB = "Merges"


class StoredFormPanel(QTabWidget):
    """The two views, fed each compression result."""

    hoverInfo = Signal(str)  # noqa: N815 (Qt signal naming)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("storedFormPanel")
        self.channelMap = ChannelMap()
        self.mergeMap = MergeMap()
        self.addTab(self.channelMap, CHANNELS_TAB)
        self.addTab(self.mergeMap, MERGES_TAB)
        self.setTabToolTip(0, "Which key channels each (layer, kv-head) stores: ThinK prunes the rest")
        self.setTabToolTip(1, "Where each evicted position's value went: merging folds it into a kept one")
        self.channelMap.hoverInfo.connect(self.hoverInfo)
        self.mergeMap.hoverInfo.connect(self.hoverInfo)

    def set_compression(self, view: CompressionView) -> None:
        """Show what `view`'s method stored; the tab of what it changed comes to the front."""
        self.channelMap.set_view(view.key_channels, view.row_labels, view.n_kv_heads)
        self.mergeMap.set_data(
            view.merge_targets, view.kept, view.token_texts, view.n_layers, view.n_kv_heads
        )
        if view.merge_targets is not None and view.key_channels is None:
            self.setCurrentWidget(self.mergeMap)
        elif view.key_channels is not None:
            self.setCurrentWidget(self.channelMap)

    def clear(self) -> None:
        self.channelMap.set_view(None, [], 1)
        self.mergeMap.set_data(None, np.zeros((0, 0), bool), [], 0, 1)
