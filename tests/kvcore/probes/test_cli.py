"""`kvlens probe`: a row per (probe, configuration), progress on stderr, bad input refused before loading."""

from __future__ import annotations

import csv

import pytest

from kvcore.cli.main import main
from kvcore.probes.scoring import PROBE_COLUMNS


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


def test_control_adds_a_no_needle_row_per_probe(tmp_path, capsys):
    out = tmp_path / "probes.csv"
    argv = ["probe", "--families", "py_assign", "--depths", "0.3,0.7", "--lengths", "300", "--control"]
    assert main([*argv, "--methods", "streaming_llm", "--ratios", "0.25", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["method"] for r in rows] == ["dense", "streaming_llm", "no_needle"] * 2
    for dense, control in zip(rows[0::3], rows[2::3], strict=True):
        assert (control["family"], control["depth"], control["answer"]) == (
            dense["family"],
            dense["depth"],
            dense["answer"],
        )
        assert int(control["prompt_tokens"]) < int(dense["prompt_tokens"])
    captured = capsys.readouterr()
    assert "no-needle control" in captured.err and "no_needle: recall" in captured.out


def test_control_needs_generated_probes(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("def f():\n    return 1\n")
    assert main(["probe", "--prompts", str(tmp_path), "--control"]) == 2
    assert "--control deletes a generated probe's needle" in capsys.readouterr().err
