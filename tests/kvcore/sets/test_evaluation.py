"""The typed prompt-set runner: a request in, rank 0's outcome out, the results file and its summary written."""

import json

from kvcore.engine.session import CompressionConfig
from kvcore.sets.evaluation import SetRequest, evaluate_set
from kvcore.sets.modes import probe_mode, sweep_mode
from kvcore.sets.summary import summary_paths

CODE = "def area(width, height):\n    return width * height\n"


def _set(path, *prompts):
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


def test_probe_set_outcome_counts_rows_and_names_the_failed_prompt(model_dirs, tmp_path):
    prompts = _set(
        tmp_path / "set.jsonl",
        {"id": "a", "prompt": CODE, "answer": " width"},
        {"id": "short", "prompt": "x", "answer": "y"},
    )
    configs = [CompressionConfig("snapkv", 0.5, window=4)]
    checked = []
    request = SetRequest(prompts, str(model_dirs["llama"]), csv=tmp_path / "out.csv")
    outcome = evaluate_set(request, probe_mode(configs), lambda s, rank: checked.append(rank))
    assert checked == [0]
    assert (outcome.n_prompts, outcome.n_configs, outcome.n_rows) == (2, 2, 2)
    assert outcome.written == (request.csv,) and outcome.n_ranks == 1
    assert len(outcome.errors) == 1 and "'short'" in outcome.errors[0] and outcome.failed
    assert [row["method"] for row in outcome.summary] == ["dense", "snapkv"]
    summary_csv, summary_json = summary_paths(request.csv)
    assert summary_csv.exists() and len(json.loads(summary_json.read_text())["configurations"]) == 2


def test_a_plot_with_nothing_to_draw_is_an_error_not_a_file(model_dirs, tmp_path):
    prompts = _set(tmp_path / "set.jsonl", {"id": "short", "prompt": "x"})
    drawn = []
    request = SetRequest(prompts, str(model_dirs["llama"]), plot=tmp_path / "f.svg")
    mode = sweep_mode([CompressionConfig("snapkv", 0.5, window=4)], tokens=2)
    outcome = evaluate_set(request, mode, lambda s, rank: None, lambda *a: drawn.append(a))
    assert drawn == [] and outcome.unplotted and outcome.plot_error and outcome.written == ()
