"""`kvlens sweep/probe --prompts`: a prompt column, a seeded summary, resume, failures named, and mlx.launch
ranks that write the very bytes a single process writes."""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvcore.cli.main import main
from kvcore.measure.export import ADDED_COLUMNS, PROMPT_SWEEP_COLUMNS, RENAMED_COLUMNS, SET_SUMMARY_COLUMNS
from kvcore.sets.summary import summary_paths

ROOT = Path(__file__).resolve().parents[3]
CODE = "def area(width, height):\n    return width * height\nThe quick brown fox jumps over the lazy dog.\n"
GRID = ["--methods", "snapkv,streaming_llm", "--ratios", "0.25,0.5", "--tokens", "4"]
N_ROWS_PER_PAIR = 4 * 2  # the llama test model: 4 layers × 2 kv-heads


def _write_set(path: Path, bad: bool = False) -> Path:
    lines = [
        {"id": f"doc{i}", "prompt": CODE * (1 + i), **({"answer": " width"} if i % 2 else {})}
        for i in range(6)
    ]
    if bad:  # one token: valid JSONL, but its prefill refuses it (under 2 ranks it falls to rank 1)
        lines.insert(3, {"id": "one-token", "prompt": "x"})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _sweep(model, prompts, out, *extra):
    argv = ["sweep", "--model", str(model), "--prompts", str(prompts), *GRID, "--csv", str(out), *extra]
    return main(argv)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def full_run(model_dirs, tmp_path_factory):
    """The set run once in this process: (prompt set, results CSV)."""
    root = tmp_path_factory.mktemp("set")
    prompts, out = _write_set(root / "set.jsonl"), root / "full.csv"
    assert _sweep(model_dirs["llama"], prompts, out) == 0
    return prompts, out


def test_every_row_names_its_prompt_and_the_summary_has_one_row_per_configuration(full_run):
    _, out = full_run
    rows = _rows(out)
    assert list(rows[0]) == list(PROMPT_SWEEP_COLUMNS) and len(rows) == 6 * 4 * N_ROWS_PER_PAIR
    assert [r["prompt"] for r in rows[:: 4 * N_ROWS_PER_PAIR]] == [f"doc{i}" for i in range(6)]
    assert {r["recalled"] for r in rows if r["prompt"] in ("doc0", "doc2")} == {""}
    assert {r["recalled"] for r in rows if r["prompt"] == "doc1"} <= {"0", "1"}
    summary_csv, summary_json = summary_paths(out)
    summary = _rows(summary_csv)
    assert list(summary[0]) == list(SET_SUMMARY_COLUMNS) and len(summary) == 4
    doc = json.loads(summary_json.read_text())
    assert doc["confidence"] == 0.95 and len(doc["configurations"]) == 4
    for s, j in zip(summary, doc["configurations"], strict=True):
        assert s["prompts"] == "6" and float(s["kl_low"]) <= float(s["kl_mean"]) <= float(s["kl_high"])
        kls = {
            float(r["kl_mean"])
            for r in rows
            if (r["method"], r["retention_ratio"]) == (j["method"], s["retention_ratio"])
        }
        assert len(kls) == 6 and abs(sum(kls) / 6 - j["kl_mean"]) < 1e-12
        assert 0.0 <= j["recall_mean"] <= 1.0  # three prompts have an answer


def test_resume_after_an_interrupted_run_writes_the_same_files(full_run, model_dirs, tmp_path, capsys):
    prompts, full = full_run
    text = full.read_text()
    lines = text.splitlines(keepends=True)
    out = tmp_path / "resumed.csv"
    # what an interrupted run leaves: whole (prompt, configuration) groups, here 2 prompts and half of a third
    out.write_text("".join(lines[: 1 + (2 * 4 + 2) * N_ROWS_PER_PAIR]))
    capsys.readouterr()
    assert _sweep(model_dirs["llama"], prompts, out, "--resume") == 0
    assert out.read_text() == text
    for a, b in zip(summary_paths(out), summary_paths(full), strict=True):
        assert a.read_bytes() == b.read_bytes()
    progress = capsys.readouterr().err
    assert "] 12/24 " in progress and "] 4/24 " not in progress  # 10 pairs kept, 14 run


def test_resume_reads_a_file_written_with_the_old_bits_column(full_run, model_dirs, tmp_path):
    """An earlier release wrote `bits` for the keys' width (and no newer columns): its rows are kept."""
    prompts, full = full_run
    rows = _rows(full)
    old_columns = [RENAMED_COLUMNS.get(c, c) for c in PROMPT_SWEEP_COLUMNS if c not in ADDED_COLUMNS]
    assert "bits" in old_columns and "key_bits" not in old_columns
    out = tmp_path / "old.csv"
    with open(out, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(old_columns)
        for r in rows[:-N_ROWS_PER_PAIR]:  # every pair but the last one
            new = {RENAMED_COLUMNS.get(c, c): v for c, v in r.items()}
            writer.writerow([new[c] for c in old_columns])
    assert _sweep(model_dirs["llama"], prompts, out, "--resume") == 0
    resumed, fresh = _rows(out), _rows(full)
    assert (
        resumed[-N_ROWS_PER_PAIR:] == fresh[-N_ROWS_PER_PAIR:]
    )  # the pair run now, as a fresh run writes it
    unrecorded = ("per_head", "baseline_dtype")  # that release did not record them: left empty
    assert {r[c] for r in resumed[:-N_ROWS_PER_PAIR] for c in unrecorded} == {""}
    strip = [{k: v for k, v in r.items() if k not in unrecorded} for r in (*resumed, *fresh)]
    assert strip[: len(resumed)] == strip[len(resumed) :]


def test_resume_refuses_another_runs_file(full_run, model_dirs, tmp_path, capsys):
    prompts, full = full_run
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    assert _sweep(model_dirs["llama"], prompts, other, "--resume") == 2
    assert "columns differ" in capsys.readouterr().err
    assert other.read_text() == "a,b\n1,2\n"


def test_a_failing_prompt_is_named_the_others_finish_and_the_status_is_1(
    full_run, model_dirs, tmp_path, capsys
):
    prompts, out = _write_set(tmp_path / "bad.jsonl", bad=True), tmp_path / "bad.csv"
    assert _sweep(model_dirs["llama"], prompts, out) == 1
    err = capsys.readouterr().err
    assert "kvlens: error: prompt 'one-token': prompt is too short" in err
    rows = _rows(out)
    assert len(rows) == 6 * 4 * N_ROWS_PER_PAIR and "one-token" not in {r["prompt"] for r in rows}
    assert out.read_bytes() == full_run[1].read_bytes()  # the other prompts' rows, as a run without it


def test_probe_over_a_prompt_set_scores_recall_with_a_dense_row(model_dirs, tmp_path, capsys):
    prompts = tmp_path / "needles.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"n{i}", "prompt": CODE * 2 + "x = ", "answer": "42"}) + "\n" for i in range(3)
        )
    )
    out = tmp_path / "probe.csv"
    argv = ["probe", "--model", str(model_dirs["llama"]), "--prompts", str(prompts), "--csv", str(out)]
    assert main([*argv, "--methods", "snapkv", "--ratios", "0.5"]) == 0
    rows = _rows(out)
    assert [(r["prompt"], r["method"]) for r in rows] == [
        (f"n{i}", m) for i in range(3) for m in ("dense", "snapkv")
    ]
    assert {r["answer"] for r in rows} == {"42"} and {r["recalled"] for r in rows} <= {"0", "1"}
    summary = _rows(summary_paths(out)[0])
    assert list(summary[0]) == list(SET_SUMMARY_COLUMNS) and [s["method"] for s in summary] == [
        "dense",
        "snapkv",
    ]
    assert summary[0]["kl_mean"] == "" and summary[0]["recall_mean"] != ""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text(CODE)
    capsys.readouterr()
    assert main(["probe", "--model", str(model_dirs["llama"]), "--prompts", str(folder)]) == 2
    assert "has no answer" in capsys.readouterr().err


@pytest.mark.skipif(
    shutil.which("mlx.launch", path=str(Path(sys.executable).parent)) is None, reason="no mlx.launch"
)
def test_two_ring_ranks_write_the_bytes_one_process_writes(full_run, model_dirs, tmp_path):
    """The 6 × 4 set plus a prompt that fails on rank 1 (one launch, to keep the suite short): rank 0 names it
    and writes, byte for byte, the file one process writes for the 6 × 4 set."""
    _, full = full_run
    prompts = _write_set(tmp_path / "bad.jsonl", bad=True)
    out = tmp_path / "ranks.csv"
    launcher = str(Path(sys.executable).parent / "mlx.launch")
    cmd = [launcher, "-n", "2", "--backend", "ring", "--", sys.executable, "-m", "app", "sweep"]
    cmd += ["--model", str(model_dirs["llama"]), "--prompts", str(prompts), *GRID, "--csv", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]  # mlx.launch exits 0 whatever its ranks return
    assert "kvlens: error: prompt 'one-token': prompt is too short" in proc.stderr  # failed on rank 1
    # rank 1 exits 0 (the launcher may still stop it with -15 once rank 0 has exited 1: harmless, it is done)
    assert "rank 0 exited with code 1" in proc.stderr and "rank 1 exited with code 1" not in proc.stderr
    assert out.read_bytes() == full.read_bytes()
    for a, b in zip(summary_paths(out), summary_paths(full), strict=True):
        assert a.read_bytes() == b.read_bytes()
    assert "bytes moved between 2 ranks" in proc.stdout
