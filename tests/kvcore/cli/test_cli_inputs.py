"""Issue 42's reproductions that must now work (the refusals are in test_adversarial.py): prompt ids a spreadsheet
would run, a float residual covering everything kept, NaN metrics under --json, stdin and outputs that merely look
alike."""

import csv
import io
import json
import sys

import pytest

from kvcore.cli.main import main

PROMPT = "def area(width, height):\n    return width * height\nThe quick brown fox jumps over the lazy dog.\n"
GRID = ["--methods", "snapkv", "--ratios", "0.5", "--bits", "16", "--tokens", "2"]


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_prompt_ids_starting_with_formula_characters_run_and_resume(model_dirs, tmp_path, capsys):
    ids = ["=sum", "+one", "-two", "@three"]
    prompts = tmp_path / "set.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": PROMPT * 2}) + "\n" for i in ids))
    out = tmp_path / "o.csv"
    argv = ["sweep", "--model", str(model_dirs["llama"]), "--prompts", str(prompts), *GRID, "--csv", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    rows = _rows(out)
    assert [r["prompt"] for r in rows[:: len(rows) // 4]] == [f"'{i}" for i in ids]  # neutralised in the file
    whole = out.read_bytes()
    kept = out.read_text().splitlines(True)
    out.write_text("".join(kept[: 1 + len(rows) // 2]))  # the first two prompts done, then killed
    assert main([*argv, "--resume"]) == 0, capsys.readouterr().err
    assert out.read_bytes() == whole


def test_a_float_residual_covering_everything_kept_packs_nothing(model_dirs, capsys):
    argv = [
        "compress",
        "--model",
        str(model_dirs["llama"]),
        "-p",
        PROMPT * 3,
        "--method",
        "full",
        "--ratio",
        "1",
    ]
    argv += ["--bits", "4", "--group-size", "32", "--fp-recent", "1200", "--tokens", "3", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["bytes_compressed_total"] == summary["bytes_dense_total"]
    assert summary["kl_mean"] == 0.0 and summary["fp_recent"] == 1200


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"bare {name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_prints_null_for_a_metric_without_a_value(model_dirs, capsys):
    argv = ["compress", "--model", str(model_dirs["llama"]), "-p", PROMPT, "--tokens", "1", "--json"]
    assert main(argv) == 0
    summary = _strict(capsys.readouterr().out)  # one token: nothing to compare, the KL has no value
    assert summary["kl_mean"] is None and summary["compared_tokens"] == 0


def test_utf8_on_stdin_still_reads(model_dirs, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("def größe(): ...\n".encode()), "utf-8"))
    argv = ["compress", "--model", str(model_dirs["llama"]), "--prompt", "-", "--tokens", "2", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    assert _strict(capsys.readouterr().out)["method"] == "snapkv"


@pytest.mark.parametrize("name", ["o.csv", "in.txt.csv"])
def test_outputs_beside_their_input_are_written(model_dirs, tmp_path, capsys, name):
    (tmp_path / "in.txt").write_text(PROMPT)
    out = tmp_path / name
    argv = ["compress", "--model", str(model_dirs["llama"]), "--prompt-file", str(tmp_path / "in.txt")]
    assert main([*argv, "--tokens", "2", "--csv", str(out), "--positions", str(tmp_path / "p.json")]) == 0
    assert (tmp_path / "in.txt").read_text() == PROMPT and _rows(out) and (tmp_path / "p.json").exists()
