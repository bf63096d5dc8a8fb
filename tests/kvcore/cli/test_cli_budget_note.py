"""kvlens compress with pyramidkv: a real pyramid in the CSV when the rule applies, and the reason when it does not."""

import csv
import json

from kvcore.cli.main import main

PROMPT = (
    "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog.\n" * 6
)


def _compress(model_dir, tmp_path, ratio: float, window: int) -> list[dict]:
    prompt, out = tmp_path / "prompt.txt", tmp_path / f"stats-{ratio}.csv"
    prompt.write_text(PROMPT)
    argv = ["compress", "--model", str(model_dir), "--prompt-file", str(prompt), "--method", "pyramidkv"]
    argv += ["--ratio", str(ratio), "--window", str(window), "--tokens", "3", "--csv", str(out), "--json"]
    assert main(argv) == 0
    with open(out, newline="") as f:
        return list(csv.DictReader(f))


def test_pyramidkv_keeps_more_in_lower_layers(model_dirs, tmp_path, capsys):
    rows = _compress(model_dirs["llama"], tmp_path, 0.75, 8)
    captured = capsys.readouterr()
    assert json.loads(captured.out)["budget_note"] is None and "note:" not in captured.err
    per_layer = [int(r["tokens_kept"]) for r in rows if r["kv_head"] == "0"]
    assert len(per_layer) == 4 and all(a > b for a, b in zip(per_layer, per_layer[1:], strict=False))
    assert all(r["budget_note"] == "" for r in rows)


def test_pyramidkv_fallback_is_reported_on_stderr_json_and_csv(model_dirs, tmp_path, capsys):
    rows = _compress(model_dirs["llama"], tmp_path, 0.25, 64)
    captured = capsys.readouterr()
    note = json.loads(captured.out)["budget_note"]
    assert note and "uniform" in note and "window=64" in note
    assert f"kvlens: note: {note}" in captured.err
    assert {r["budget_note"] for r in rows} == {note}
    assert len({r["tokens_kept"] for r in rows}) == 1  # the uniform fallback: every layer keeps n
