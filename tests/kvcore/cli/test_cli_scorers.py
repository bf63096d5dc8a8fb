"""kvpress's scorers (leverage, cur, non_causal_attention, compactor, cap) through the CLI: listed, run, refused."""

import json

import pytest

from kvcore import methods
from kvcore.cli.main import main

SCORERS = ("leverage", "cur", "non_causal_attention", "compactor", "cap")


def test_methods_lists_each_scorer_with_its_definition_and_paper(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in SCORERS:
        assert f"{name}: {methods.describe(name)}\n    paper: {methods.paper(name)}\n" in out
    assert "    paper: Compactor: Calibrated Query-Agnostic" in out


@pytest.mark.parametrize("method", SCORERS)
def test_compress_keeps_a_quarter_per_head(model_dirs, prompt_file, tmp_path, capsys, method):
    positions = tmp_path / "kept.json"
    argv = ["compress", "--model", str(model_dirs["llama"]), "--prompt-file", str(prompt_file)]
    argv += ["--method", method, "--ratio", "0.25", "--tokens", "1", "--positions", str(positions), "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["method"] == method
    kept = json.loads(positions.read_text())
    n_tokens = len(kept["prompt_tokens"])
    n = max(1, int(n_tokens * 0.25))
    assert all(len(h) == n and max(h) < n_tokens for layer in kept["layers"] for h in layer["heads"])


@pytest.mark.parametrize(
    ("method", "param", "message"),
    [
        ("leverage", "sketch_dimension=0", "sketch_dimension must be an integer >= 1"),
        ("cur", "leverage_type=4", "cur takes leverage_type up to 3"),
        ("non_causal_attention", "chunk_size=0", "chunk_size must be an integer >= 1"),
        ("compactor", "blending=-0.5", "blending must be >= 0, or -1"),
        ("cap", "n_sink=65", "cap takes n_sink up to 64"),
    ],
)
def test_bad_parameter_is_one_line(model_dirs, prompt_file, capsys, method, param, message):
    argv = ["compress", "--model", str(model_dirs["llama"]), "--prompt-file", str(prompt_file)]
    assert main([*argv, "--method", method, "--param", param]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlens: error:") and message in err and "\n" not in err
