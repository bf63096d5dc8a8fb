"""`--resume` reads an earlier results file as strictly as a fresh run writes it.

A row a fresh run could not have written (a cell count that differs from the header, a number column that holds
text, a text cell a spreadsheet would run as a formula, a row repeated) is refused with the file and line, so no
hand edit, truncation or forged cell reaches the rewritten file or its summary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from kvcore.measure.export import CONFIG_COLUMNS, neutralise

#: Columns that hold text (every other column holds a number or is empty).
TEXT_COLUMNS: frozenset[str] = frozenset(
    {
        "prompt",
        "method",
        "schedule",
        "method_params",
        "baseline_dtype",
        "quant_scheme",
        "execution",
        "bits_per_layer",
        "budget_note",
        "family",
        "answer",
        "continuation",
        "model",  # kvlens ruler's table (kvcore.probes.ruler.table)
        "mode",
        "haystack",
    }
)
#: Columns that together name one row of a results file (those present in its header).
KEY_COLUMNS: tuple[str, ...] = ("prompt", *CONFIG_COLUMNS, "layer", "kv_head")
_FIX = "delete that row (it runs again) or give a new --csv"


def check_rows(path: Path, columns: Sequence[str], rows: Sequence[tuple[int, list[str]]]) -> None:
    """Refuse the first row (line, cells) that a fresh run would not write; ValueError names path:line."""
    key_at = [columns.index(c) for c in KEY_COLUMNS if c in columns]
    seen: dict[tuple[str, ...], int] = {}
    for line, cells in rows:
        where = f"--resume: {path}:{line}"
        if len(cells) != len(columns):
            raise ValueError(
                f"{where} has {len(cells)} cells, the header {len(columns)} (cut short or edited); {_FIX}"
            )
        for column, cell in zip(columns, cells, strict=True):
            problem = _cell_problem(column, cell)
            if problem is not None:
                raise ValueError(f"{where}: {column} {cell[:40]!r} {problem}; {_FIX}")
        key = tuple(cells[i] for i in key_at)
        if key in seen:
            raise ValueError(f"{where} repeats the row on line {seen[key]}; {_FIX}")
        seen[key] = line


def _cell_problem(column: str, cell: str) -> str | None:
    if column in TEXT_COLUMNS:
        if neutralise(cell) != cell:
            return "would run as a spreadsheet formula (kvlens writes it with a leading ')"
        return None
    if cell == "":
        return None
    try:
        value = float(cell)
    except ValueError:
        return "is not a number"
    if math.isfinite(value) and cell.strip() != cell:
        return "is not a number as kvlens writes it"
    return None
