"""Ties are broken by position (lower first), so identical input keeps identical positions, run after run."""

import numpy as np
import pytest

from kvcore.cli.main import main
from kvcore.defaults import DATA_DIR_ENV
from kvcore.methods import available, calibration, get, selection
from tests.kvcore.methods.helpers import observation, random_qk

PER_HEAD = ("knorm", "snapkv", "h2o", "random", "pyramidkv", "adakv", "adakv-knorm")


def _tied_observation(n_tokens: int = 120):
    """Keys that repeat exactly every 5 positions (a repeated token without RoPE): knorm's scores tie exactly."""
    q, k = random_qk(3, n_tokens, 2, 2, 8)
    k = np.ascontiguousarray(np.tile(k[:, :5], (1, n_tokens // 5, 1)))
    return [observation(q, k) for _ in range(2)]


@pytest.mark.parametrize("method", PER_HEAD)
def test_selection_on_tied_keys_is_identical_five_times(method):
    runs = []
    for _ in range(5):
        ranking = selection.rank(_tied_observation(), method)
        runs.append([[np.asarray(h).tolist() for h in layer] for layer in selection.select(ranking, 0.3)])
    assert all(run == runs[0] for run in runs[1:])


def test_knorm_keeps_the_lowest_positions_among_exact_ties():
    """Every key has 24 exact copies; at n = 36 of 120 each head keeps whole tie groups, then the earliest
    copies of the next group: the tie-break is the position, lower first."""
    obs = _tied_observation()
    ranking = selection.rank(obs, "knorm")
    scores = ranking.layers[0].scores
    for head, kept in enumerate(selection.select(ranking, 0.3)[0]):
        by_value = sorted(set(scores[head].tolist()), reverse=True)
        expected = []
        for value in by_value:
            expected += np.flatnonzero(scores[head] == value).tolist()  # ascending positions
        assert kept.tolist() == sorted(expected[:36])
        assert len(np.unique(scores[head])) == 5  # the ties are exact


@pytest.mark.parametrize(
    "method",
    [
        m
        for m in available()
        if not (get(m).wraps or get(m).chooses or get(m).needs_reconstruction)
        or m in ("adakv", "adakv-knorm")
    ],
)  # the other wrappers and the methods that pick their own positions (stable sorts): test_wrappers.py runs each;
# kvzip (a replay per run: suite time) is checked for the same positions on a second pass in test_kvzip
def test_compress_positions_files_are_byte_identical_five_times(
    method, model_dirs, tmp_path, capsys, monkeypatch
):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("x = x + 1\n" * 30)  # repeated tokens: tied keys in the low layers
    if calibration.needs_artifact(get(method)):  # qfilter, ...: its artifact first (the prompt as the set)
        monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
        assert (
            main(["calibrate", method, "--model", str(model_dirs["llama"]), "--prompts", str(tmp_path)]) == 0
        )
    files = []
    for run in range(5):
        out = tmp_path / f"kept-{run}.json"
        argv = [
            "compress",
            "--model",
            str(model_dirs["llama"]),
            "--prompt-file",
            str(prompt),
            "--tokens",
            "1",
        ]
        assert main([*argv, "--method", method, "--ratio", "0.3", "--positions", str(out), "--json"]) == 0
        files.append(out.read_bytes())
    capsys.readouterr()
    assert all(f == files[0] for f in files[1:])
