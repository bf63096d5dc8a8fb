"""StatsTable: column order, formatting, numeric sorting from the header, rows() in display order."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.widgets.stats_table import COLUMNS, StatsTable
from kvcore.measure.export import stats_columns


def _rows():
    rows = []
    for layer in range(3):
        for head in range(2):
            rows.append(
                {
                    "method": "snapkv",
                    "retention_ratio": 0.25,
                    "bits": 4,
                    "group_size": 64,
                    "layer": layer,
                    "kv_head": head,
                    "tokens_total": 100,
                    "tokens_kept": [30, 9, 100, 25, 11, 2][layer * 2 + head],
                    "bytes_dense": 1_000_000,
                    "bytes_compressed": 250_000 + layer,
                    "attention_mass_kept": 0.9 - 0.1 * layer,
                    "key_rmse": None if head else 0.01 * (layer + 1),
                    "value_rmse": 0.02,
                }
            )
    return rows


def test_columns_and_display(qtbot):
    table = StatsTable()
    qtbot.addWidget(table)
    table.set_rows(_rows())
    model = table.model()
    assert table.objectName() == "statsTable"
    headers = [model.headerData(c, Qt.Orientation.Horizontal) for c in range(model.columnCount())]
    assert headers == list(COLUMNS)
    assert model.rowCount() == 6
    assert model.index(0, COLUMNS.index("bytes_dense")).data() == "1,000,000"
    assert model.index(1, COLUMNS.index("key_rmse")).data() == "—"
    assert model.index(0, COLUMNS.index("method")).data() == "snapkv"


def test_sorting_by_header_is_numeric(qtbot):
    table = StatsTable()
    qtbot.addWidget(table)
    table.set_rows(_rows())
    col = COLUMNS.index("tokens_kept")
    table.sortByColumn(col, Qt.SortOrder.AscendingOrder)
    assert [r["tokens_kept"] for r in table.rows()] == [2, 9, 11, 25, 30, 100]
    table.horizontalHeader().setSortIndicator(col, Qt.SortOrder.DescendingOrder)
    assert [r["tokens_kept"] for r in table.rows()] == [100, 30, 25, 11, 9, 2]
    assert table.model().index(0, col).data() == "100"


def test_missing_values_sort_last_and_sort_survives_new_rows(qtbot):
    table = StatsTable()
    qtbot.addWidget(table)
    table.set_rows(_rows())
    table.sortByColumn(COLUMNS.index("key_rmse"), Qt.SortOrder.DescendingOrder)
    assert [r["key_rmse"] for r in table.rows()][:3] == [0.03, 0.02, 0.01]
    assert [r["key_rmse"] for r in table.rows()][3:] == [None, None, None]
    rows = _rows()
    rows[5]["tokens_kept"] = 1
    table.sortByColumn(COLUMNS.index("tokens_kept"), Qt.SortOrder.AscendingOrder)
    table.set_rows(rows)
    assert table.rows()[0]["tokens_kept"] == 1
    table.set_rows([])
    assert table.rows() == []


def test_pinned_columns_appear_and_the_sort_follows_its_column_by_name(qtbot):
    table = StatsTable()
    qtbot.addWidget(table)
    table.set_rows(_rows())
    table.sortByColumn(COLUMNS.index("tokens_kept"), Qt.SortOrder.DescendingOrder)
    columns = stats_columns(pinned=True)
    rows = [dict(r, jaccard_vs_pinned=0.1 * i, pinned_method="h2o") for i, r in enumerate(_rows())]
    table.set_rows(rows, columns)
    model = table.model()
    headers = [model.headerData(c, Qt.Orientation.Horizontal) for c in range(model.columnCount())]
    assert headers == list(columns) and headers[-1] == "jaccard_vs_pinned" and table.columns() == columns
    assert [r["tokens_kept"] for r in table.rows()] == [100, 30, 25, 11, 9, 2]
    table.sortByColumn(columns.index("jaccard_vs_pinned"), Qt.SortOrder.AscendingOrder)
    assert [r["jaccard_vs_pinned"] for r in table.rows()] == pytest.approx([0.1 * i for i in range(6)])
    assert model.index(0, columns.index("pinned_method")).data() == "h2o"
    table.set_rows(_rows())  # unpinned: back to the plain columns
    assert model.columnCount() == len(COLUMNS) and table.columns() == COLUMNS
