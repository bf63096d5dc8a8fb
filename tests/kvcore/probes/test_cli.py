"""`kvlens probe`: a row per (probe, configuration), progress on stderr, bad input refused before loading."""

from __future__ import annotations

import csv

import pytest

from kvcore.cli import main
from kvcore.probes.run import PROBE_COLUMNS


def test_probe_grid_writes_one_row_per_probe_and_configuration(tmp_path, capsys):
    out = tmp_path / "probes.csv"
    argv = ["probe", "--families", "yaml_key,toml_entry", "--depths", "0.2,0.8", "--lengths", "256"]
    assert main([*argv, "--methods", "snapkv,streaming_llm", "--ratios", "0.5", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == list(PROBE_COLUMNS)
    assert len(rows) == 2 * 2 * (1 + 2)
    assert {(r["family"], r["depth"]) for r in rows} == {
        (f, d) for f in ("yaml_key", "toml_entry") for d in ("0.2", "0.8")
    }
    for r in rows:
        assert r["recalled"] in ("0", "1")
        assert (r["recalled"] == "1") == r["continuation"].lstrip(" ").startswith(r["answer"])
    captured = capsys.readouterr()
    assert "probe 4/4" in captured.err
    assert "dense: recall" in captured.out and "snapkv r=0.5 bits=16 (paper): recall" in captured.out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--families", "nope"], "--families: unknown nope"),
        (["--depths", "1.5"], "each depth must be between 0 and 1"),
        (["--lengths", "10"], "at least 64 tokens"),
        (["--seeds", "0"], "--seeds must be at least 1"),
        (["--lengths", "4000"], "does not fit the model's context"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "p.csv"
    assert main(["probe", *args, "--methods", "snapkv", "--ratios", "0.5", "--csv", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("kvlens: error:") and message in err[-1]
    assert not out.exists()


def test_a_folder_as_csv_is_refused(tmp_path, capsys):
    assert main(["probe", "--csv", str(tmp_path)]) == 2
    assert "it is a folder" in capsys.readouterr().err
