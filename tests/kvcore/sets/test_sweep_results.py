"""A one-prompt sweep CSV (`kvlens sweep --csv`, the Sweep dock's Export CSV) read back as results: one point per
configuration at the sweep's values, no interval; a damaged one refused in one line naming the file and line."""

from __future__ import annotations

import csv

import pytest

from kvcore.cli.main import main
from kvcore.measure.export import SWEEP_COLUMNS
from kvcore.sets.results_file import read_results

PROMPT = "def area(w, h):\n    return w * h\n\nprint(area(3, 4))\n" * 3


@pytest.fixture(scope="module")
def sweep_csv(model_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "sweep.csv"
    argv = ["sweep", "--model", str(model_dirs["llama"]), "-p", PROMPT, "--methods", "snapkv,streaming_llm"]
    assert main([*argv, "--ratios", "0.25,0.5", "--tokens", "3", "--csv", str(out)]) == 0
    return out


def _rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_each_configuration_is_one_point_at_the_sweeps_values(sweep_csv):
    rows = _rows(sweep_csv)
    assert list(rows[0]) == list(SWEEP_COLUMNS) and "prompt" not in rows[0]
    firsts = {(r["method"], r["retention_ratio"]): r for r in reversed(rows)}
    points = read_results(sweep_csv)
    assert [(p.config.method, p.config.ratio) for p in points] == [
        ("snapkv", 0.25),
        ("snapkv", 0.5),
        ("streaming_llm", 0.25),
        ("streaming_llm", 0.5),
    ]
    for p in points:
        row = firsts[(p.config.method, str(p.config.ratio))]
        assert p.prompts == 1 and p.intervals == {}
        assert p.memory == (float(row["compression_ratio"]),) * 3
        assert p.metrics["agreement"] == float(row["agreement"])
        assert p.metrics["kl_mean"] == float(row["kl_mean"]) and p.metrics["needle_recall"] is None
    assert points[0].memory[0] < points[1].memory[0]  # 25 % keeps fewer bytes than 50 %


def _damaged(sweep_csv, tmp_path, column: str, value: str, row: int = 2) -> str:
    rows = _rows(sweep_csv)
    rows[row][column] = value
    bad = tmp_path / "bad.csv"
    with open(bad, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(ValueError) as err:
        read_results(bad)
    message = str(err.value)
    assert message.startswith(f"{bad}: ") and "\n" not in message
    return message


def test_a_mistyped_cell_names_the_file_line_and_column(sweep_csv, tmp_path):
    message = _damaged(sweep_csv, tmp_path, "kl_mean", "abc")
    assert "line 4: kl_mean is 'abc', not a number" in message and "kvlens sweep --csv" in message


def test_rows_of_one_configuration_that_disagree_are_refused(sweep_csv, tmp_path):
    message = _damaged(sweep_csv, tmp_path, "agreement", "0.123")
    assert "line 4: agreement is '0.123', line 2 of the same configuration says" in message


def test_a_bad_ratio_and_a_missing_column_are_refused(sweep_csv, tmp_path):
    assert "retention_ratio is '2', expected a number in (0, 1]" in _damaged(
        sweep_csv, tmp_path, "retention_ratio", "2", row=0
    )
    text = sweep_csv.read_text().splitlines()
    drop = text[0].split(",").index("kl_mean")
    bad = tmp_path / "no_kl.csv"
    bad.write_text(
        "\n".join(",".join(c for i, c in enumerate(t.split(",")) if i != drop) for t in text) + "\n"
    )
    with pytest.raises(ValueError, match="this sweep CSV lacks the column kl_mean"):
        read_results(bad)


def test_a_probe_csv_is_not_taken_for_a_sweep(tmp_path):
    from kvcore.probes.scoring import PROBE_COLUMNS

    probe = tmp_path / "probe.csv"
    probe.write_text(",".join(PROBE_COLUMNS) + "\n" + ",".join("1" for _ in PROBE_COLUMNS) + "\n")
    with pytest.raises(ValueError, match="nor a sweep's kv_head and compression_ratio columns"):
        read_results(probe)
