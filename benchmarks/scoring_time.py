"""Scoring time of every method against snapkv's, on the same captured prefill (issue 38).

What is timed is `kvcore.methods.selection.rank`: every layer's scores and their ranking, from the observations a
prefill with capture left (h2o sums deferred, pre-RoPE query statistics on), as `Session.ranking` runs it when a
method is first chosen. The model is Llama-3.2-1B's shape with its first layers and random weights in float32
(benchmarks.common.build); the prefill is not timed. Each method is timed best of `--repeats` after one warm-up;
wrappers are timed over snapkv. h2o's column sums are deferred at capture and computed by its first ranking, so
its figure is that first call (fresh capture, one run). Figures and the ratio to snapkv come from one run (the machine is noisy).

    .venv/bin/python -m benchmarks.scoring_time [--contexts 2048 8192] [--layers 2] [--repeats 2]
        [--rows bench_out/scoring.jsonl --isolated]

`--rows` appends each finished cell as it ends and skips the cells already there, so a long run resumes;
`--isolated` runs the timing in child processes, so a method that kills its process leaves that as its cell.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)

# isort: split
import mlx.core as mx
import numpy as np

from benchmarks.common import build
from kvcore import methods
from kvcore.capture.prefill import prefill_with_capture
from kvcore.defaults import CAPTURE_WINDOW
from kvcore.methods.selection import rank

BASELINE = "snapkv"
LONG_MS = 10_000.0


def timed_methods() -> list[str]:
    """Every scorer, and every wrapper over snapkv (the wrappers' cost over other scorers adds that scorer's)."""
    names = methods.available()
    return [n for n in names if "-" not in n or n.endswith(f"-{BASELINE}")]


def chosen(only: list[str] | None) -> list[str]:
    """The timed methods (all, or those named and snapkv), then any other method named explicitly (a wrapper over
    another scorer, as dms-kvzap, kvpress's pairing)."""
    names = [n for n in timed_methods() if not only or n in only or n == BASELINE]
    return names + [n for n in only or [] if n not in names and n in methods.available()]


def time_rank(observations: list, name: str, repeats: int) -> float:
    """Best-of-`repeats` ms of ranking every layer with method `name`, after one warm-up; a warm-up of LONG_MS or
    more is the figure itself (the machine's noise is a small share of it, and repeats would cost minutes)."""
    method = methods.get(name)
    if method.needs_h2o:  # the deferred sums are computed once, by the first ranking: that call is the cost
        return _ms(lambda: rank(observations, method))
    best = _ms(lambda: rank(observations, method))
    if best >= LONG_MS:
        return best
    best = float("inf")
    for _ in range(repeats):
        best = min(best, _ms(lambda: rank(observations, method)))
    return best


def _ms(work) -> float:
    start = time.perf_counter()
    work()
    return (time.perf_counter() - start) * 1e3


def capture(model, ids: list[int]):
    """Session.prefill's capture: window CAPTURE_WINDOW, h2o sums deferred, the last token held back."""
    captured = prefill_with_capture(
        model, ids, window=CAPTURE_WINDOW, h2o="lazy", hold_last=True, query_stats=True
    )
    mx.eval([c.keys for c in captured.cache if getattr(c, "keys", None) is not None])
    return captured


class ByteTokenizer:
    """Stands in for a tokenizer where a replay-scored method (kvzip) encodes its fixed prompt: one id per byte,
    so the replay has the length a byte-level tokenizer would give it; no chat template."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())


def replayed(method) -> list:
    """The methods in `method`'s tree (itself, a wrapper's inner, a chain's stages) scored by an extra forward pass,
    as Session._reconstruct walks them: dms-kvzap's replay is its inner kvzap's."""
    found, pending = [], [method]
    while pending:
        m = pending.pop()
        if m.needs_reconstruction:
            found.append(m)
        pending += [i for i in (getattr(m, "inner", None), *getattr(m, "stages", ())) if i is not None]
    return found


def time_reconstruction(model, captured, ids: list[int], name: str) -> float:
    """ms of a replay-scored method's first ranking: its forward pass over the context, then the ranking."""
    method = methods.get(name)

    def first_ranking() -> None:
        for m in replayed(method):
            m.reconstruct(model, ByteTokenizer(), captured, ids, False)
        rank(captured.observations, method)

    return _ms(first_ranking)


def run(
    contexts: list[int], layers: int, repeats: int, only: list[str] | None = None, rows: Path | None = None
) -> list[tuple[str, dict[int, float | str]]]:
    """Time every (method, context) not already in `rows` (a JSON-lines file, appended as each finishes)."""
    model = build("llama-3.2-1b", layers)
    names = chosen(only)
    done = read_rows(rows) if rows else {}
    for T in contexts:
        todo = [n for n in names if (n, T) not in done]
        if not todo:
            continue
        ids = np.random.default_rng(T).integers(0, 32000, size=T).tolist()
        captured = capture(model, ids)
        for name in todo:
            if rows:
                _append(rows, {"method": name, "tokens": T, "started": True})
            if methods.get(name).needs_h2o:  # fresh: h2o's deferred sums are computed once per capture
                captured = capture(model, ids)
            try:
                if replayed(methods.get(name)):  # its replay is the cost, once per capture
                    cell: float | str = time_reconstruction(model, captured, ids, name)
                else:
                    cell = time_rank(captured.observations, name, repeats)
            except ValueError as error:  # a method this capture cannot serve says why
                cell = f"refused: {error}"
            done[(name, T)] = cell
            if rows:
                _append(rows, {"method": name, "tokens": T, "ms": cell})
        del captured
    return [(n, {T: done[(n, T)] for T in contexts if (n, T) in done}) for n in names]


def _append(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_rows(path: Path) -> dict[tuple[str, int], float | str]:
    """The finished cells of a rows file; a cell started and never finished is the process that died in it."""
    cells: dict[tuple[str, int], float | str] = {}
    if not path.exists():
        return cells
    for line in path.read_text().splitlines():
        record = json.loads(line)
        key = (record["method"], record["tokens"])
        if "ms" in record:
            cells[key] = record["ms"]
    return cells


def unfinished(path: Path) -> tuple[str, int] | None:
    """The (method, tokens) the last process started and did not finish, if any."""
    last = None
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        last = None if "ms" in record else (record["method"], record["tokens"])
    return last


def supervise(argv: list[str], rows: Path) -> None:
    """Run the timing in child processes until every cell is written: a child that dies (a crash, the memory
    killer) leaves its cell as the signal that ended it, and the next child goes on from the cell after."""
    while True:
        child = subprocess.run([sys.executable, "-X", "faulthandler", "-m", "benchmarks.scoring_time", *argv])
        if child.returncode == 0:
            return
        cell = unfinished(rows)
        if cell is None:
            raise SystemExit(f"the timing process failed (exit {child.returncode}) outside any method")
        how = f"signal {-child.returncode}" if child.returncode < 0 else f"exit {child.returncode}"
        print(f"{cell[0]} at {cell[1]} tokens: the process died ({how}); going on", flush=True)
        _append(rows, {"method": cell[0], "tokens": cell[1], "ms": f"died ({how})"})


def markdown(rows: list[tuple[str, dict[int, float | str]]], contexts: list[int]) -> str:
    base = dict(rows)[BASELINE]
    head = "| method | " + " | ".join(f"{T} tokens (ms) | × snapkv" for T in contexts) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(contexts))]
    for name, cells in rows:
        parts = []
        for T in contexts:
            v, b = cells.get(T), base.get(T)
            if isinstance(v, float) and isinstance(b, float):
                parts += [f"{v:.1f}", f"{v / b:.2f}"]
            else:
                parts += ["not timed" if v is None else str(v), ""]
        lines.append(f"| {name} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--layers", type=int, default=2, help="first layers of Llama-3.2-1B's shape")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--methods", nargs="*", default=None, help="only these methods (and snapkv)")
    parser.add_argument(
        "--rows",
        type=Path,
        default=None,
        help="JSON-lines file of finished cells: written as each ends, resumed",
    )
    parser.add_argument("--report", action="store_true", help="print the table of --rows FILE; time nothing")
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="time in child processes; one that dies leaves its cell (needs --rows)",
    )
    args = parser.parse_args(argv)
    if (args.isolated or args.report) and args.rows is None:
        parser.error("--isolated and --report need --rows FILE (where the cells are written)")
    if args.isolated or args.report:
        child_argv = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--isolated"]
        if not args.report:
            supervise(child_argv, args.rows)
        done = read_rows(args.rows)
        names = chosen(args.methods)
        rows = [(n, {T: done[(n, T)] for T in args.contexts if (n, T) in done}) for n in names]
    else:
        rows = run(args.contexts, args.layers, args.repeats, args.methods, args.rows)
    print(f"Llama-3.2-1B shape, {args.layers} layers, float32, best of {args.repeats}")
    print(markdown(rows, args.contexts))


if __name__ == "__main__":
    main()
