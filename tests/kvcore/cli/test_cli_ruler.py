"""`kvlens ruler`: the leaderboard table (one row per method, a column per compression ratio and per task), resumed
from --out, plotted as SVG; bad input is one line before the model loads."""

from __future__ import annotations

import csv
import io
import json

import pytest

from kvcore.cli.main import main

BASE = ["--length", "300", "--samples", "1", "--tasks", "niah_single", "--ratios", "0.5"]


def _ruler(model, out, *extra: str) -> int:
    return main(["ruler", "--model", str(model), *BASE, "--out", str(out), *extra])


def _rows(path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_the_table_is_written_resumed_and_plotted(model_dirs, tmp_path, capsys):
    out, plot = tmp_path / "ruler.csv", tmp_path / "ruler.svg"
    assert _ruler(model_dirs["llama"], out, "--methods", "dense,snapkv", "--plot", str(plot)) == 0
    printed = capsys.readouterr().out
    rows = _rows(out)
    assert [r["method"] for r in rows] == ["dense", "snapkv"] and "snapkv" in printed
    assert {"0.5", "niah_single@0.5", "mode", "haystack"} <= set(rows[0]) and rows[0][
        "mode"
    ] == "query-agnostic"
    assert plot.read_text().count("<polyline") == 2
    # A kept row is not run again: its (edited) score stays; the new method is added in --methods' order.
    text = out.read_text().splitlines()
    cells = next(csv.reader([text[1]]))
    cells[7] = "42.0"
    out.write_text("\n".join([text[0], ",".join(cells), *text[2:]]) + "\n")
    assert _ruler(model_dirs["llama"], out, "--methods", "streaming_llm,dense") == 0
    assert "resuming" in capsys.readouterr().err
    again = _rows(out)  # snapkv, not asked for now, is kept after the methods asked for
    assert [r["method"] for r in again] == ["streaming_llm", "dense", "snapkv"]
    assert again[1]["0.5"] == "42.0" and again[2] == rows[1]


def test_the_samples_a_checkpoint_holds_are_not_run_again(model_dirs, tmp_path, capsys):
    out = tmp_path / "ruler.csv"
    saved = tmp_path / "ruler.samples.json"
    key = {
        "model": str(model_dirs["llama"]),
        "mode": "query-agnostic",
        "haystack": "code",
        "length": 300,
        "samples": 1,
        "schedule": "paper",
        "tasks": ["niah_single"],
        "ratios": [0.5],
        "methods": ["dense"],
    }
    saved.write_text(json.dumps({"run": key, "scores": {"0": {"dense": [7]}}}))
    assert _ruler(model_dirs["llama"], out, "--methods", "dense") == 2  # a score kvlens would not write
    assert "holds a score kvlens would not write" in capsys.readouterr().err and not out.exists()
    saved.write_text(json.dumps({"run": key, "scores": {"0": {"dense": [1.0]}}}))
    assert _ruler(model_dirs["llama"], out, "--methods", "dense") == 0
    assert _rows(out)[0]["0.5"] == "100.0" and not saved.exists()  # the random model's own answer scores 0


def test_a_table_of_another_run_is_refused_and_kept(model_dirs, tmp_path, capsys):
    out = tmp_path / "ruler.csv"
    assert _ruler(model_dirs["llama"], out, "--methods", "dense") == 0
    before = out.read_text()
    capsys.readouterr()
    assert _ruler(model_dirs["llama"], out, "--methods", "dense", "--query-aware") == 2
    err = capsys.readouterr().err
    assert "is from another run (mode 'query-agnostic'" in err and err.count("\n") == 1
    assert out.read_text() == before


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tasks", "qa"], "--tasks: unknown task 'qa'"),
        (["--methods", "dense,snapkvv"], "--methods: unknown method 'snapkvv'"),
        (["--ratios", "1.0"], "compression ratios are in [0, 1)"),
    ],
)
def test_bad_input_is_one_line_before_the_model_loads(tmp_path, capsys, extra, message):
    argv = ["ruler", "--model", str(tmp_path / "no-model"), *BASE, "--out", str(tmp_path / "t.csv")]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "t.csv").exists()
