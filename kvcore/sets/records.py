"""A prompt set's rows as the results CSV holds them (text cells), and the file written whole at every step.

Rows are encoded to the cells `csv_text` writes before they travel between ranks or reach the file, so what a
resumed run reads back is what a fresh run would hold. An earlier release's file (a column since renamed or added)
is read as this release's cells.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvcore.atomic import write_text
from kvcore.measure.export import ADDED_COLUMNS, RENAMED_COLUMNS, csv_text

#: Rows of one (prompt, configuration) pair: each a list of CSV cells as text.
Records = list[list[str]]


def encode_rows(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Records:
    """Rows as the CSV's text cells (what `csv_text` writes, read back): the form rows are stored and sent in."""
    return list(csv.reader(io.StringIO(csv_text(rows, columns), newline="")))[1:]


def records_text(columns: Sequence[str], records: Records) -> str:
    """The CSV text of `records` under the header `csv_text` writes (cells written as they are)."""
    buf = io.StringIO()
    buf.write(csv_text([], columns))
    csv.writer(buf, lineterminator="\n").writerows(records)
    return buf.getvalue()


def write_records(path: Path, columns: Sequence[str], records: Records) -> None:
    """Write the results file atomically (a kill mid-write leaves the previous round's file)."""
    write_text(path, records_text(columns, records))


def read_records(path: Path, columns: Sequence[str]) -> Records:
    """Rows of an earlier run's file for `--resume` (none when it does not exist); ValueError if its header
    differs from this run's columns."""
    if not path.exists():
        return []
    with open(path, encoding="utf-8", newline="") as f:
        records = list(csv.reader(f))
    if not records:
        return []
    header = records[0]
    if header == list(columns):
        return records[1:]
    upgrade = _upgrade(header, columns)
    if upgrade is None:
        raise ValueError(
            f"--resume: {path} was not written by this kind of run (its columns differ); "
            "give a new --csv or the matching command"
        )
    return [upgrade(r) for r in records[1:]]


def _upgrade(header: list[str], columns: Sequence[str]) -> Callable[[list[str]], list[str]] | None:
    """Rows of a file an earlier release wrote (a column since renamed, `bits` -> `key_bits`, or one it did not
    have) as this release's cells, or None when the header is not such a file."""
    where = {c: header.index(c) for c in header}
    sources = []
    for c in columns:
        old = RENAMED_COLUMNS.get(c)
        if c in where:
            sources.append(where[c])
        elif old in where:
            sources.append(where[old])
        elif c in ADDED_COLUMNS:
            sources.append(ADDED_COLUMNS[c])
        else:
            return None
    if len(header) != sum(isinstance(s, int) for s in sources):
        return None
    return lambda r: [r[s] if isinstance(s, int) else s for s in sources]
