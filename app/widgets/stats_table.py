"""Per-(layer, kv-head) statistics table, sortable, in the CSV export's column order (kvcore.measure.export)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableView, QWidget

from kvcore.measure.export import STATS_COLUMNS

COLUMNS = STATS_COLUMNS
_Index = QModelIndex | QPersistentModelIndex


def _format(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _sort_key(value: Any) -> tuple[int, Any]:
    """Numbers by value, text by text, missing values last."""
    if value is None:
        return (2, 0)
    if isinstance(value, (int, float)):
        return (0, value)
    return (1, str(value))


class StatsModel(QAbstractTableModel):
    """Rows are plain dicts keyed by the columns; the raw value is under Qt.UserRole."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._rows: list[dict[str, Any]] = []
        self._columns: tuple[str, ...] = COLUMNS

    def set_rows(self, rows: list[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> None:
        self.beginResetModel()
        self._rows = [dict(r) for r in rows]
        self._columns = tuple(columns)
        self.endResetModel()

    def columns(self) -> tuple[str, ...]:
        return self._columns

    def rows(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows]

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802 (Qt API)
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self._columns)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        value = self._rows[index.row()].get(self._columns[index.column()])
        if role == Qt.ItemDataRole.DisplayRole:
            return _format(value)
        if role == Qt.ItemDataRole.UserRole:
            return value
        if role == Qt.ItemDataRole.TextAlignmentRole and isinstance(value, (int, float)):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:  # noqa: N802
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return self._columns[section]
        return None

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        key = self._columns[column]
        self.layoutAboutToBeChanged.emit()
        missing = [r for r in self._rows if r.get(key) is None]
        present = [r for r in self._rows if r.get(key) is not None]
        present.sort(key=lambda r: _sort_key(r.get(key)), reverse=order == Qt.SortOrder.DescendingOrder)
        self._rows = present + missing
        self.layoutChanged.emit()


class StatsTable(QTableView):
    """The statistics view; `rows()` gives the rows in the order shown, ready for CSV export."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("statsTable")
        self._model = StatsModel(self)
        self.setModel(self._model)
        self.setSortingEnabled(True)
        self.horizontalHeader().setSortIndicatorShown(True)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().setVisible(False)
        self.setAlternatingRowColors(True)

    def set_rows(self, rows: list[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> None:
        """Replace the rows (and the columns: a pin adds some), keeping the user's sort column and order."""
        header = self.horizontalHeader()
        old_columns = self._model.columns()
        section = header.sortIndicatorSection()
        sort_key = old_columns[section] if 0 <= section < len(old_columns) else None
        self._model.set_rows(rows, columns)
        if sort_key in columns and rows:
            section = tuple(columns).index(sort_key)
            if section != header.sortIndicatorSection():
                header.setSortIndicator(section, header.sortIndicatorOrder())  # sorts through sortByColumn
            else:
                self._model.sort(section, header.sortIndicatorOrder())

    def columns(self) -> tuple[str, ...]:
        """The columns shown, in order (the CSV export writes these)."""
        return self._model.columns()

    def rows(self) -> list[dict[str, Any]]:
        """Copies of the rows in display order."""
        return self._model.rows()
