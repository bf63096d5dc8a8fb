"""A prompt-set results file read back as frontier points: one per configuration, each metric's mean and interval.

It takes what `kvlens sweep/probe --prompts --csv out.csv` writes — `out.summary.csv`, `out.summary.json`, or
the per-row `out.csv` itself (summarised here by kvcore.sets.summary, the code that wrote the summary) — and a
one-prompt sweep CSV (`kvlens sweep --csv`, the Sweep dock's Export CSV: each configuration one point, no
interval), and refuses anything else with a ValueError naming the problem and the fix. Qt-free: the app's File ▸ Open Results…
and `kvlens sweep --prompts --plot` both draw these points.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvcore.defaults import MIN_PROMPTS_FOR_INTERVAL
from kvcore.measure.export import CONFIG_COLUMNS, SET_METRICS, SET_SUMMARY_COLUMNS

#: A summary's metric name → the kvcore.measure.frontier.METRICS key it is drawn as.
FRONTIER_KEYS: dict[str, str] = {
    "kl": "kl_mean",
    "agreement": "agreement",
    "nll_delta": "nll_delta",
    "recall": "needle_recall",
}
#: The summary metric that is the memory axis (compressed / dense bytes).
MEMORY = "compression_ratio"
#: The columns a summary must have: all but the last, few_prompts, which a file written before it lacks (it
#: follows from prompts).
SUMMARY_NEEDED: tuple[str, ...] = tuple(c for c in SET_SUMMARY_COLUMNS if c != "few_prompts")
#: A larger file is refused before it is read: no results file of this tool comes near it.
MAX_RESULTS_BYTES = 512 * 1024 * 1024
_FIX = (
    "open the .csv, .summary.csv or .summary.json that `kvlens sweep --prompts … --csv` wrote, or a sweep CSV "
    "(`kvlens sweep --csv`, the Sweep dock's Export CSV)"
)
#: The columns a one-prompt sweep CSV (kvcore.measure.export.SWEEP_COLUMNS) must have to be drawn: the
#: configuration, its memory and the metrics a sweep measures.
SWEEP_NEEDED: tuple[str, ...] = (*CONFIG_COLUMNS, "agreement", "kl_mean", "nll_delta", MEMORY)


@dataclass(frozen=True)
class ResultConfig:
    """A configuration as a results file names it (the CONFIG_COLUMNS cells, typed)."""

    method: str
    schedule: str
    ratio: float
    bits: int
    value_bits: int
    group_size: int | None
    fp_recent: int = 0

    @property
    def widths(self) -> tuple[int, int]:
        """(key width, value width), as CompressionConfig.widths: the frontier draws one line per pair."""
        return self.bits, self.value_bits

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "schedule": self.schedule,
            "ratio": self.ratio,
            "bits": self.bits,
            "value_bits": self.value_bits,
            "group_size": self.group_size,
            "fp_recent": self.fp_recent,
        }


@dataclass(frozen=True)
class ResultPoint:
    """One configuration over a prompt set: mean and (low, high) interval per frontier metric, and its memory."""

    index: int
    config: ResultConfig
    prompts: int
    metrics: dict[str, float | None]  # frontier metric key → mean over prompts (None: not measured)
    intervals: dict[str, tuple[float, float]]  # frontier metric key → (low, high)
    memory: tuple[float, float, float]  # compressed / dense bytes: mean, low, high

    @property
    def percent_of_dense(self) -> float:
        return 100.0 * self.memory[0]

    @property
    def few_prompts(self) -> bool:
        """Whether its intervals come from too few prompts to be more than their min–max (none at all: False)."""
        return bool(self.intervals) and self.prompts < MIN_PROMPTS_FOR_INTERVAL


def read_results(path: str | os.PathLike[str]) -> list[ResultPoint]:
    """The points of a results file; ValueError "<path>: <problem>; <fix>" for anything that is not one."""
    path = Path(path)
    try:
        if path.is_dir():
            raise ValueError(f"{path} is a folder; {_FIX}")
        size = path.stat().st_size
        if size == 0:
            raise ValueError(f"{path} is empty; {_FIX}")
        if size > MAX_RESULTS_BYTES:
            raise ValueError(f"{path} is {size:,} bytes, too large for a results file; {_FIX}")
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc}); {_FIX}") from None
    try:
        text = raw.decode("utf-8-sig")
        if "\x00" in text:
            raise UnicodeDecodeError("utf-8", raw, raw.find(b"\x00"), raw.find(b"\x00") + 1, "NUL byte")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not a text file (byte {exc.start} is not UTF-8 text); {_FIX}") from None
    try:
        if text.lstrip().startswith(("{", "[")):
            return points_from_summary(_json_rows(text), lambda i: f"configuration {i + 1}")
        return _csv_points(text)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _json_rows(text: str) -> list[Mapping[str, Any]]:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not valid JSON ({exc}); {_FIX}") from None
    rows = doc.get("configurations") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f'a JSON file without a "configurations" list is not a prompt-set summary; {_FIX}')
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"configuration {i + 1} is not a JSON object; {_FIX}")
    return rows


def _csv_points(text: str) -> list[ResultPoint]:
    try:
        records = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise ValueError(f"not a readable CSV ({exc}); {_FIX}") from None
    header = records[0] if records else []
    if "prompts" in header:
        kind, needed = "summary", SUMMARY_NEEDED
    elif "prompt" in header:
        kind, needed = "per-row results", (*CONFIG_COLUMNS, "prompt", MEMORY)
    elif "kv_head" in header and MEMORY in header:  # a sweep's (layer, kv-head) rows; a probe CSV has neither
        kind, needed = "sweep", SWEEP_NEEDED
    else:
        raise ValueError(
            "not a prompt-set results file: it has neither a 'prompts' column (a summary) nor a 'prompt' "
            f"column (per-row results) nor a sweep's kv_head and {MEMORY} columns; {_FIX}"
        )
    missing = [c for c in needed if c not in header]
    if missing:
        raise ValueError(
            f"this {kind} CSV lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}; it was "
            f"written by another tool or an older kvlens: rerun the command, or {_FIX}"
        )
    rows = []
    for line, record in enumerate(records[1:], start=2):
        if not record:
            continue
        if len(record) != len(header):
            raise ValueError(f"line {line} has {len(record)} cells, the header {len(header)}; {_FIX}")
        rows.append((line, dict(zip(header, record, strict=True))))
    if not rows:
        raise ValueError(f"it has a header but no rows; run the prompt set first, or {_FIX}")
    if kind == "summary":
        lines = [line for line, _ in rows]
        return points_from_summary([r for _, r in rows], lambda i: f"line {lines[i]}")
    from kvcore.sets.summary import summary_rows

    for line, row in rows:
        for column in SET_METRICS.values():
            _number(row.get(column), f"line {line}", column, finite=False)
    if kind == "sweep":
        return _sweep_points(rows)
    summary = summary_rows([r for _, r in rows])
    return points_from_summary(summary, lambda i: f"configuration {i + 1}")


def _sweep_points(rows: list[tuple[int, dict[str, str]]]) -> list[ResultPoint]:
    """A sweep CSV's configurations as one-prompt points without intervals. A sweep repeats its configuration's
    summary on every (layer, kv-head) row: its first row is read, and a row that disagrees is refused."""
    first: dict[tuple[str, ...], tuple[int, dict[str, str]]] = {}
    for line, row in rows:
        key = tuple(row[c] for c in CONFIG_COLUMNS)
        seen = first.setdefault(key, (line, row))
        for column in SWEEP_NEEDED[len(CONFIG_COLUMNS) :]:
            if row[column] != seen[1][column]:
                raise ValueError(
                    f"line {line}: {column} is {row[column]!r}, line {seen[0]} of the same configuration says "
                    f"{seen[1][column]!r}; a sweep repeats one value per configuration; {_FIX}"
                )
    lines = [line for line, _ in first.values()]
    summary = [{**row, "prompts": 1, **_one_prompt(row)} for _, row in first.values()]
    points = points_from_summary(summary, lambda i: f"line {lines[i]}")
    return [replace(p, intervals={}) for p in points]


def _one_prompt(row: Mapping[str, str]) -> dict[str, str]:
    """One prompt's value as a summary's mean, low and high (an empty cell stays empty: not measured)."""
    out = {}
    for name, column in SET_METRICS.items():
        cell = row.get(column, "")
        out.update({f"{name}_{part}": cell for part in ("mean", "low", "high")})
    return out


def points_from_summary(
    rows: Sequence[Mapping[str, Any]], where: Callable[[int], str] = lambda i: f"configuration {i + 1}"
) -> list[ResultPoint]:
    """ResultPoints from summary rows (kvcore.sets.summary's dicts, a summary CSV's text cells or its JSON
    values); ValueError naming the row and the column for a missing or mistyped cell."""
    if not rows:
        raise ValueError(f"it lists no configurations; run the prompt set first, or {_FIX}")
    points = []
    for i, row in enumerate(rows):
        at = where(i)
        missing = [c for c in SUMMARY_NEEDED if c not in row]
        if missing:
            raise ValueError(f"{at} lacks {', '.join(missing)}; {_FIX}")
        stats = {name: _stats(row, name, at) for name in SET_METRICS}
        memory = stats[MEMORY]
        if memory is None or not memory[0] > 0:
            raise ValueError(
                f"{at} has no {MEMORY}_mean above 0: the frontier needs its memory; rerun the prompt set"
            )
        config = ResultConfig(
            method=_text(row["method"], at, "method", required=True),
            schedule=_text(row["schedule"], at, "schedule"),
            ratio=_ratio(row["retention_ratio"], at),
            bits=_int(row["key_bits"], at, "key_bits"),
            value_bits=_int(row["value_bits"], at, "value_bits"),
            group_size=None if row["group_size"] in ("", None) else _int(row["group_size"], at, "group_size"),
            fp_recent=_int(row["fp_recent"], at, "fp_recent"),
        )
        prompts = _int(row["prompts"], at, "prompts")
        if prompts < 1:
            raise ValueError(f"{at}: prompts is {prompts}, expected at least 1; {_FIX}")
        metrics = {
            key: None if stats[name] is None else stats[name][0] for name, key in FRONTIER_KEYS.items()
        }
        intervals = {key: stats[name][1:] for name, key in FRONTIER_KEYS.items() if stats[name] is not None}
        points.append(ResultPoint(i, config, prompts, metrics, intervals, memory))
    if all(v is None for p in points for v in p.metrics.values()):
        raise ValueError(f"no configuration has a value for any metric; rerun the prompt set, or {_FIX}")
    return points


def _stats(row: Mapping[str, Any], name: str, at: str) -> tuple[float, float, float] | None:
    """(mean, low, high) of one metric; None when the mode did not measure it (all three empty)."""
    values = [_number(row[f"{name}_{part}"], at, f"{name}_{part}") for part in ("mean", "low", "high")]
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        raise ValueError(f"{at}: {name}_mean, {name}_low and {name}_high must all be given or all empty")
    return values[0], values[1], values[2]


def _number(cell: Any, at: str, column: str, finite: bool = True) -> float | None:
    """A float, None for an empty cell or nan (no value); `finite` refuses ±inf (a summary never holds one,
    a per-row file may: the summary drops it)."""
    if cell is None or cell == "":
        return None
    if isinstance(cell, bool) or not isinstance(cell, int | float | str):
        raise ValueError(f"{at}: {column} is {cell!r}, not a number; {_FIX}")
    try:
        value = float(cell)
    except ValueError:
        raise ValueError(f"{at}: {column} is {cell!r}, not a number; {_FIX}") from None
    if finite and math.isinf(value):
        raise ValueError(f"{at}: {column} is {cell!r}, not a finite number; {_FIX}")
    return None if math.isnan(value) else value


def _int(cell: Any, at: str, column: str) -> int:
    value = _number(cell, at, column)
    if value is None or not math.isfinite(value) or value != int(value):
        raise ValueError(f"{at}: {column} is {cell!r}, not a whole number; {_FIX}")
    return int(value)


def _ratio(cell: Any, at: str) -> float:
    value = _number(cell, at, "retention_ratio")
    if value is None or not 0.0 < value <= 1.0:
        raise ValueError(f"{at}: retention_ratio is {cell!r}, expected a number in (0, 1]; {_FIX}")
    return value


def _text(cell: Any, at: str, column: str, required: bool = False) -> str:
    if cell is None:
        cell = ""
    if not isinstance(cell, str) or (required and not cell):
        raise ValueError(f"{at}: {column} is {cell!r}, expected a name; {_FIX}")
    return cell
