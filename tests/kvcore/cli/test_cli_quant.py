"""kvlens --quant SCHEME: the scheme reaches the cache, the statistics CSV and the JSON summary; a width it does
not pack is refused before the model loads."""

import csv
import json

from kvcore.cli.main import main


def _args(model_dirs, prompt_file, *extra: str) -> list[str]:
    base = ["--model", str(model_dirs["llama"]), "--prompt-file", str(prompt_file), "--tokens", "4"]
    return [*base, *extra]


def test_compress_mxfp4_runs_end_to_end(model_dirs, prompt_file, tmp_path, capsys):
    totals = {}
    for quant in ("mxfp4", "affine"):
        csv_path = tmp_path / f"{quant}.csv"
        flags = ["--quant", quant, "--bits", "4", "--group-size", "32", "--csv", str(csv_path), "--json"]
        assert main(["compress", *_args(model_dirs, prompt_file, *flags)]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert (summary["quant_scheme"], summary["execution"], summary["key_bits"]) == (quant, "genuine", 4)
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        assert {(r["quant_scheme"], r["execution"], r["group_size"]) for r in rows} == {
            (quant, "genuine", "32")
        }
        totals[quant] = summary["bytes_compressed_total"]
    assert totals["mxfp4"] < totals["affine"]  # one-byte scales and no biases against float scales and biases


def test_a_width_the_scheme_does_not_pack_is_refused(model_dirs, prompt_file, capsys):
    code = main(["compress", *_args(model_dirs, prompt_file, "--quant", "mxfp4", "--bits", "8")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--bits/--key-bits 8: allowed are 4 or 16 (unquantized)" in err


def test_an_unknown_scheme_is_refused_naming_the_schemes(model_dirs, prompt_file, capsys):
    code = main(["compress", *_args(model_dirs, prompt_file, "--quant", "int3", "--bits", "4")])
    assert code == 2
    assert "--quant int3: available are affine, " in capsys.readouterr().err
