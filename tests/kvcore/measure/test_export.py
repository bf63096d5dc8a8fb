"""CSV/JSON export: column order, spreadsheet safety, pandas-free round trip through csv, atomic writes."""

import csv
import json
import os

import pytest

from kvcore.atomic import write_text
from kvcore.measure.export import STATS_COLUMNS, csv_text, neutralise, stats_columns, write_csv, write_json


def _row(**kw):
    base = dict.fromkeys(STATS_COLUMNS, 1)
    base.update(kw)
    return base


def test_header_and_values_round_trip(tmp_path):
    rows = [_row(method="snapkv", layer=i, kv_head=h, key_rmse=0.25) for i in range(2) for h in range(2)]
    path = tmp_path / "stats.csv"
    write_csv(path, rows)
    with open(path, encoding="utf-8", newline="") as f:
        parsed = list(csv.DictReader(f))
    assert list(parsed[0].keys()) == list(STATS_COLUMNS)
    assert [(int(r["layer"]), int(r["kv_head"])) for r in parsed] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(float(r["key_rmse"]) == 0.25 for r in parsed)


@pytest.mark.parametrize("evil", ["=1+1", "+SUM(A1)", "-2+3", "@cmd", "\t=x"])
def test_formula_cells_are_neutralised(evil):
    text = csv_text([_row(method=evil)], STATS_COLUMNS)
    cell = next(csv.DictReader(text.splitlines()))["method"]
    assert cell == "'" + evil
    assert neutralise(-0.5) == -0.5


def test_numbers_stay_numeric_and_missing_is_empty():
    text = csv_text([{"method": "h2o", "key_rmse": -0.125}], STATS_COLUMNS)
    row = next(csv.DictReader(text.splitlines()))
    assert row["key_rmse"] == "-0.125"
    assert row["key_bits"] == ""


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    path = tmp_path / "out.csv"
    path.write_text("old")

    class Boom:
        def get(self, key):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_csv(path, [Boom()])
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.csv"]


def test_crash_mid_write_keeps_old_file(tmp_path):
    from kvcore.atomic import write_stream

    path = tmp_path / "out.csv"
    path.write_text("old")

    def half_then_crash(fh):
        fh.write(b"half a fi")
        fh.flush()
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_stream(path, half_then_crash)
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.csv"]


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_text(tmp_path / "nope" / "x.csv", "a")


def test_json_written_and_nan_refused(tmp_path):
    write_json(tmp_path / "a.json", {"x": [1, 2]})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": [1, 2]}
    with pytest.raises(ValueError):
        write_json(tmp_path / "b.json", {"x": float("nan")})
    assert not (tmp_path / "b.json").exists()


def test_pinned_columns_name_the_whole_setting_and_come_last():
    assert stats_columns(pinned=False) == STATS_COLUMNS
    pinned = stats_columns(pinned=True)
    assert pinned[: len(STATS_COLUMNS)] == STATS_COLUMNS and pinned[-1] == "jaccard_vs_pinned"
    setting = {"method", "schedule", "retention_ratio", "key_bits", "value_bits", "fp_recent", "group_size"}
    assert {c.removeprefix("pinned_") for c in pinned[len(STATS_COLUMNS) : -1]} == setting
