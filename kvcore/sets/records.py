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
from kvcore.sets.results_file import MAX_RESULTS_BYTES
from kvcore.sets.resume_checks import check_rows

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
    """Rows of an earlier run's file for `--resume` (none when it does not exist); ValueError naming the file
    (and line) if it is not text, its header differs from this run's columns, or a row is not one a fresh run
    writes (kvcore.sets.resume_checks)."""
    if not path.exists():
        return []
    text = _results_text(path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        rows = [(reader.line_num, r) for r in reader if r]
    except csv.Error as exc:
        raise ValueError(
            f"--resume: {path}:{reader.line_num}: not readable as CSV ({exc}); give a new --csv"
        ) from None
    if header is None:
        return []
    if header == list(columns):
        check_rows(path, columns, rows)
        return [r for _, r in rows]
    upgrade = _upgrade(header, columns)
    if upgrade is None:
        raise ValueError(
            f"--resume: {path} was not written by this kind of run (its columns differ); "
            "give a new --csv or the matching command"
        )
    check_rows(path, header, rows)
    return [upgrade(r) for _, r in rows]


def _results_text(path: Path) -> str:
    """The file's UTF-8 text; ValueError naming it for a folder, a pipe, a huge or a binary file."""
    from kvcore.sets.prompt_sets import read_capped

    data = read_capped(path, "--resume: --csv", MAX_RESULTS_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        text, bad = "", exc.start
    else:
        bad = text.find("\x00")
    if bad >= 0:
        raise ValueError(
            f"--resume: {path} is not a text file (byte {bad} is not UTF-8 text); give the --csv an earlier "
            "run wrote, or a new --csv"
        )
    return text


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
