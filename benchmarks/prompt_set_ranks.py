"""A prompt set on 1 and on 2 local ranks (`mlx.launch -n 2 --backend ring`): wall time, speed-up, bytes moved.

Same set, same grid, the demo model; checks the two results files are byte-identical. On a machine with few
cores the two ranks share them, so the figure shows the mechanism (shards, gather, one writer), not what two
Macs give. Run: `.venv/bin/python -m benchmarks.prompt_set_ranks [--prompts 8] [--chars 3000]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = ["--methods", "snapkv,streaming_llm", "--ratios", "0.25,0.5", "--tokens", "16"]


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    return time.perf_counter() - start, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--chars", type=int, default=3000, help="characters of the longest prompt")
    args = ap.parse_args()
    text = (ROOT / "resources/prompts/plain_code.txt").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        lines = [
            json.dumps({"id": f"p{i}", "prompt": text[: args.chars * (i + 1) // args.prompts]})
            for i in range(args.prompts)
        ]
        (folder / "set.jsonl").write_text("\n".join(lines) + "\n")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        app = [sys.executable, "-m", "app", "sweep", "--prompts", str(folder / "set.jsonl"), *GRID]
        one, _ = _run([*app, "--csv", str(folder / "one.csv")], env)
        launcher = str(Path(sys.executable).parent / "mlx.launch")
        two, out = _run(
            [launcher, "-n", "2", "--backend", "ring", "--", *app, "--csv", str(folder / "two.csv")], env
        )
        same = (folder / "one.csv").read_bytes() == (folder / "two.csv").read_bytes()
        moved = re.search(r"(\d+) bytes moved", out)
        size = (folder / "one.csv").stat().st_size
    print(f"{args.prompts} prompts × 4 configurations, demo model, {os.cpu_count()} cores")
    print(f"1 rank: {one:.1f} s; 2 ranks: {two:.1f} s; speed-up {one / two:.2f}×; identical files: {same}")
    print(f"bytes moved between ranks: {moved.group(1) if moved else '?'} (results file {size} bytes)")


if __name__ == "__main__":
    main()
