"""kvlens: --key-bits / --value-bits reach the cache, the CSV, the JSON summary and the sweep grid."""

import csv
import json

import pytest

from kvcore.cli.main import main


def _args(model_dirs, prompt_file, *extra: str) -> list[str]:
    base = ["--model", str(model_dirs["llama"]), "--prompt-file", str(prompt_file), "--group-size", "32"]
    return [*base, "--tokens", "4", *extra]


def test_compress_key8_value4_is_smaller_than_8_8(model_dirs, prompt_file, tmp_path, capsys):
    totals = {}
    for flags in (["--bits", "8"], ["--key-bits", "8", "--value-bits", "4"], ["--bits", "4"]):
        csv_path = tmp_path / "s.csv"
        assert (
            main(["compress", *_args(model_dirs, prompt_file, *flags, "--csv", str(csv_path), "--json")]) == 0
        )
        summary = json.loads(capsys.readouterr().out)
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        assert {(r["key_bits"], r["value_bits"]) for r in rows} == {
            (str(summary["key_bits"]), str(summary["value_bits"]))
        }
        totals[(summary["key_bits"], summary["value_bits"])] = summary["bytes_compressed_total"]
    assert totals[(4, 4)] < totals[(8, 4)] < totals[(8, 8)]


def test_sweep_crosses_key_and_value_widths(model_dirs, prompt_file, tmp_path, capsys):
    out = tmp_path / "sweep.csv"
    argv = ["sweep", *_args(model_dirs, prompt_file), "--methods", "snapkv", "--ratios", "0.5"]
    assert main([*argv, "--bits", "8", "--value-bits", "4,8", "--csv", str(out)]) == 0
    with open(out, newline="") as f:
        pairs = {(r["key_bits"], r["value_bits"]) for r in csv.DictReader(f)}
    assert pairs == {("8", "4"), ("8", "8")}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--key-bits", "7", "--value-bits", "4"], "--bits/--key-bits 7"),
        (["--key-bits", "8", "--value-bits", "7"], "--value-bits 7"),
    ],
)
def test_bad_value_bits_exit_2(model_dirs, prompt_file, capsys, extra, message):
    assert main(["compress", *_args(model_dirs, prompt_file, *extra)]) == 2
    assert message in capsys.readouterr().err


def test_help_names_the_split_flags(capsys):
    with pytest.raises(SystemExit):
        main(["compress", "--help"])
    text = capsys.readouterr().out
    assert "--key-bits" in text and "--value-bits" in text
