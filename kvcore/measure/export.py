"""CSV and JSON writers for cache statistics: atomic, UTF-8, pandas-readable and safe in a spreadsheet."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvcore.atomic import write_text
from kvcore.defaults import DEFAULT_KERNEL, DEFAULT_N_SINK, DEFAULT_WINDOW

#: Per-(layer, kv-head) columns, in this order (the methods issue fixes them).
STATS_COLUMNS: tuple[str, ...] = (
    "method",
    "schedule",
    "retention_ratio",
    "key_bits",  # the keys' width (16: unquantized)
    "value_bits",  # the values' width (16: unquantized); split widths such as 8-bit keys, 4-bit values
    "fp_recent",  # R of the float residual: sinks and the last R prompt positions unquantized (0: none)
    "group_size",
    "per_head",  # whether each kv-head kept its own positions (as run: tova shares, adakv spreads per head)
    "window",  # the observation window (snapkv's votes; also the window of attention_mass_kept)
    "kernel",  # snapkv's pooling kernel
    "n_sink",  # attention sinks (streaming_llm, expected_attention; kept float by the fp residual)
    "method_params",  # the method's other declared parameters, NAME=VALUE;… (pyramidkv beta, adakv alpha, …)
    "quant_scheme",  # the scheme that packs K and V (kvcore.quant): affine, mxfp4, nvfp4, mxfp8, …
    "execution",  # "genuine": attention ran on the packed form; "simulated": on a dequantized copy
    "bits_per_layer",  # this row's layer's widths, key/value ("8/8" at an edge layer, "4/4" inside; empty: unpacked)
    "layer",
    "kv_head",
    "compressible",  # False for a layer stored whole (sliding window, SSM state): its bytes are the same in both
    "baseline_dtype",  # the dense cache's element type: float32 on MLX's CPU backend, bfloat16 on a Mac
    "tokens_total",
    "tokens_kept",
    "bytes_dense",
    "bytes_compressed",
    "attention_mass_kept",
    "key_rmse",
    "value_rmse",
    "budget_note",  # why pyramidkv fell back to uniform counts at this setting; empty when it did not
)

#: Columns an earlier release wrote under another name (new -> old): files from it are still read back (resume).
RENAMED_COLUMNS: dict[str, str] = {"key_bits": "bits"}
#: Columns an earlier release did not write, with the cell that reproduces its behaviour.
ADDED_COLUMNS: dict[str, str] = {
    "fp_recent": "0",
    "per_head": "",  # not recorded then (it depended on the method as well as the flag)
    "window": str(DEFAULT_WINDOW),
    "kernel": str(DEFAULT_KERNEL),
    "n_sink": str(DEFAULT_N_SINK),
    "method_params": "",
    "quant_scheme": "affine",  # the only scheme then
    "execution": "genuine",  # affine attention always ran on the packed form
    "bits_per_layer": "",  # every layer at the configuration's widths then
    "baseline_dtype": "",  # not recorded then
}

#: The columns of STATS_COLUMNS that name a configuration of a grid (all before "per_head"): what a pin records and
#: what keys a prompt set's rows. The method's parameters after them are the same for every configuration of a run.
CONFIG_COLUMNS: tuple[str, ...] = STATS_COLUMNS[: STATS_COLUMNS.index("per_head")]
#: Appended to every row while a configuration is pinned (B): which one, and per layer the Jaccard index
#: |A ∩ B| / |A ∪ B| of the (kv-head, prompt position) sets kept now (A) and by the pin (B).
PINNED_COLUMNS: tuple[str, ...] = (*(f"pinned_{c}" for c in CONFIG_COLUMNS), "jaccard_vs_pinned")


#: Appended to every row of a `kvlens sweep` CSV (and the app's sweep export): the configuration's summary.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "agreement",
    "kl_mean",
    "kl_max",
    "nll_delta",
    "first_divergence",
    "compared_tokens",
    "bytes_dense_total",
    "bytes_compressed_total",
    "compression_ratio",
    "recompress_ms",
    "regenerate_ms",
)
#: The columns of a sweep CSV, in order.
SWEEP_COLUMNS: tuple[str, ...] = STATS_COLUMNS + SUMMARY_COLUMNS

#: Summary columns that are wall times: left out of prompt-set files, which must come out byte-identical from a
#: resumed or a distributed run (times go to stderr instead).
TIMING_COLUMNS: tuple[str, ...] = ("recompress_ms", "regenerate_ms")
#: `kvlens sweep --prompts`: which prompt, the sweep's columns without the times, and recall (empty when the
#: prompt has no answer; 1/0 otherwise).
PROMPT_SWEEP_COLUMNS: tuple[str, ...] = (
    "prompt",
    *STATS_COLUMNS,
    *(c for c in SUMMARY_COLUMNS if c not in TIMING_COLUMNS),
    "recalled",
)
#: What a prompt-set summary reports per configuration: the row column each summary metric is taken from.
#: compression_ratio (compressed / dense bytes, per prompt) is the memory axis a frontier of the summary needs.
SET_METRICS: dict[str, str] = {
    "kl": "kl_mean",
    "agreement": "agreement",
    "nll_delta": "nll_delta",
    "recall": "recalled",
    "compression_ratio": "compression_ratio",
}
#: One row per configuration of a prompt-set run, the same columns for `sweep` and `probe` (a metric that mode
#: does not measure is empty): how many prompts, then each metric's mean and bootstrap interval over prompts, and
#: last whether the prompts were too few (< MIN_PROMPTS_FOR_INTERVAL) for the interval to be more than a min–max
#: (1/0; added last, so a file written before it lacks only that column and is still read).
SET_SUMMARY_COLUMNS: tuple[str, ...] = (
    *CONFIG_COLUMNS,
    "prompts",
    *(f"{m}_{part}" for m in SET_METRICS for part in ("mean", "low", "high")),
    "few_prompts",
)


def stats_columns(pinned: bool) -> tuple[str, ...]:
    """The statistics columns, with PINNED_COLUMNS when a configuration is pinned."""
    return STATS_COLUMNS + PINNED_COLUMNS if pinned else STATS_COLUMNS


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralise(value: Any) -> Any:
    """Make a text cell inert in spreadsheets (a leading quote); numbers stay numbers."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, bool):
        return int(value)
    return neutralise(value) if isinstance(value, str) else value


def csv_text(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Rows as CSV text with a header; keys missing from a row are written empty."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([neutralise(c) for c in columns])
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return buf.getvalue()


def write_csv(
    path: str | os.PathLike, rows: Iterable[Mapping[str, Any]], columns: Sequence[str] = STATS_COLUMNS
) -> None:
    """Write rows to `path` atomically (no partial file on failure)."""
    write_text(path, csv_text(list(rows), columns))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically."""
    write_text(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")
