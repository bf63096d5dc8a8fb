"""Prompt sets over `mlx.launch` (issue 42, item 18): a rank killed mid-run makes rank 0 exit 1 with one
`kvlens: error:` line naming that rank; killing the launcher takes every rank down with it."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LAUNCHER = shutil.which("mlx.launch", path=str(Path(sys.executable).parent))
PROMPT = "def area(width, height):\n    return width * height\nThe quick brown fox jumps over the lazy dog.\n"

pytestmark = pytest.mark.skipif(LAUNCHER is None, reason="no mlx.launch")


def _launch(model: Path, folder: Path) -> tuple[subprocess.Popen, Path]:
    """Two ring ranks over a set long enough to be killed mid-run; (launcher, its --csv)."""
    prompts = folder / "set.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"d{i}", "prompt": PROMPT * 3}) + "\n" for i in range(400)))
    out = folder / "o.csv"
    cmd = [LAUNCHER, "-n", "2", "--backend", "ring", "--", sys.executable, "-m", "app", "sweep"]
    cmd += [
        "--model",
        str(model),
        "--prompts",
        str(prompts),
        "--methods",
        "snapkv,h2o",
        "--ratios",
        "0.25,0.5",
    ]
    cmd += ["--bits", "16", "--tokens", "4", "--csv", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    deadline = time.monotonic() + 120
    while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert out.exists(), "the launch wrote no first round"
    return proc, out


def _rank_pids(out: Path) -> dict[int, int]:
    """rank -> pid of the processes running this launch (found by their --csv argument)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(out).encode() in cmdline and b"sweep" in cmdline:
            for item in environ:
                if item.startswith(b"MLX_RANK="):
                    found[int(item[9:])] = int(pid)
    return found


def _wait_gone(out: Path, seconds: float) -> dict[int, int]:
    deadline = time.monotonic() + seconds
    while (left := _rank_pids(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_a_killed_rank_is_named_by_rank_0_which_exits_1(model_dirs, tmp_path):
    proc, out = _launch(model_dirs["llama"], tmp_path)
    pids = _rank_pids(out)
    os.kill(pids[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    lines = [line for line in err.split("\n") if line.startswith("kvlens: error:")]
    assert lines == [
        f"kvlens: error: rank 1 (pid {pids[1]}) exited before the prompt set was done; the finished rounds are in "
        "--csv: rerun the same command with --resume"
    ], err[-2000:]
    assert "rank 0 exited with code 1" in err and "Traceback" not in err
    assert out.read_text().startswith("prompt,")  # the last whole round, never a partial file


def test_killing_the_launcher_takes_every_rank_down(model_dirs, tmp_path):
    """Rank 0 is paused first, so rank 1 sits in a collective that can never complete: only its own watch of the
    launcher can end it (as on a machine where a dead peer's socket does not wake the ring)."""
    proc, out = _launch(model_dirs["llama"], tmp_path)
    pids = _rank_pids(out)
    os.kill(pids[0], signal.SIGSTOP)
    try:
        proc.kill()
        proc.communicate(timeout=30)
        left = _wait_gone(out, 10)
        assert set(left) == {0}  # rank 1 left on its own; rank 0 is still paused
    finally:
        os.kill(pids[0], signal.SIGCONT)
    left = _wait_gone(out, 10)
    for pid in left.values():
        os.kill(pid, signal.SIGKILL)
    assert left == {}
