"""`kvlens ruler`: RULER-format tasks scored per method and compression ratio, as kvpress's leaderboard.

  kvlens ruler --model M --length 4096 --methods dense,snapkv,knorm --ratios 0.25,0.5,0.75,0.875 \\
      [--query-aware] [--haystack code|noise] [--samples 20] [--tasks niah_single,vt] --out table.csv [--plot p.svg]

One prefill per sample serves every method. The table (one row per method; per compression ratio the mean over
tasks, then each task) is printed and written to --out atomically; the per-sample scores are kept in
`<out>.samples.json` after every round until then. An existing --out of the same run is resumed: its methods are
kept and skipped, and the samples its checkpoint holds are not run again. Progress goes to stderr. Under
`mlx.launch` the samples are spread over the ranks and rank 0 writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvcore.cli.progress import draw_progress, end_progress
from kvcore.defaults import (
    DEFAULT_RULER_HAYSTACK,
    DEFAULT_RULER_LENGTH,
    DEFAULT_RULER_METHODS,
    DEFAULT_RULER_RATIOS,
    DEFAULT_RULER_SAMPLES,
    DEFAULT_SCHEDULE,
    SCHEDULES,
)


def add_arguments(s: argparse.ArgumentParser) -> None:
    from kvcore.probes.ruler import HAYSTACKS

    s.add_argument("--length", type=int, default=DEFAULT_RULER_LENGTH, help="tokens of context and question")
    s.add_argument(
        "--methods",
        default=",".join(DEFAULT_RULER_METHODS),
        help="comma-separated; 'dense' is the uncompressed cache",
    )
    s.add_argument(
        "--ratios",
        default=",".join(map(str, DEFAULT_RULER_RATIOS)),
        help="compression ratios, kvpress's: 1 − retention (0.25 keeps three quarters)",
    )
    s.add_argument("--query-aware", action="store_true", help="compress context and question together")
    s.add_argument("--haystack", choices=HAYSTACKS, default=DEFAULT_RULER_HAYSTACK)
    s.add_argument("--samples", type=int, default=DEFAULT_RULER_SAMPLES, help="seeds per task")
    s.add_argument("--tasks", default="", help="comma-separated (default: every task)")
    s.add_argument("--schedule", choices=SCHEDULES, default=DEFAULT_SCHEDULE)
    s.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="context and question as one user message, as mlx_lm.generate (default: on when the tokenizer has one)",
    )
    s.add_argument("--out", type=Path, required=True, help="the table as CSV (resumed when it exists)")
    s.add_argument("--plot", type=Path, help="score against compression ratio as SVG, one line per method")


def _run_spec(args: argparse.Namespace) -> Any:
    """The run the arguments ask for; ValueError with the fix before the model loads."""
    from kvcore.methods import get
    from kvcore.probes.ruler import tasks
    from kvcore.probes.ruler.run import RulerRun
    from kvcore.probes.ruler.table import DENSE

    methods = tuple(dict.fromkeys(m.strip() for m in args.methods.split(",") if m.strip()))
    for m in methods:
        if m != DENSE:
            try:
                get(m)
            except ValueError as error:
                raise ValueError(f"--methods: {error} (or {DENSE}, the uncompressed cache)") from None
    try:
        ratios = tuple(dict.fromkeys(float(r) for r in args.ratios.split(",") if r.strip()))
    except ValueError:
        raise ValueError(
            f"--ratios {args.ratios!r}: expected comma-separated numbers, e.g. 0.25,0.5"
        ) from None
    if not methods or not ratios:
        raise ValueError("--methods and --ratios need at least one value each")
    if any(not 0 <= r < 1 for r in ratios):
        raise ValueError(f"--ratios {args.ratios}: compression ratios are in [0, 1) (1 − retention)")
    names = tuple(t.strip() for t in args.tasks.split(",") if t.strip()) or tuple(tasks())
    unknown = [t for t in names if t not in tasks()]
    if unknown:
        raise ValueError(f"--tasks: unknown task {unknown[0]!r}; available: {', '.join(tasks())}")
    if args.samples < 1 or args.length < 1:
        raise ValueError("--samples and --length must be at least 1")
    if args.out.suffix.lower() != ".csv" or (args.plot is not None and args.plot.suffix.lower() != ".svg"):
        raise ValueError("--out is a .csv file and --plot a .svg file")
    for path in (args.out, args.plot):
        if path is not None and (path.is_dir() or not path.resolve().parent.is_dir()):
            raise ValueError(f"cannot write {path}: give a file in an existing folder")
    run = RulerRun(
        model=args.model,
        methods=methods,
        ratios=ratios,
        tasks=names,
        haystack=args.haystack,
        length=args.length,
        samples=args.samples,
        query_aware=args.query_aware,
        schedule=args.schedule,
        chat_template=args.chat_template,
    )
    for m in methods:
        if m != DENSE:
            run.configs(m)
    return run


def _kept_rows(path: Path, columns: tuple[str, ...], run: Any) -> list[dict[str, str]]:
    """The rows of an earlier run of the same table in --out (none when absent); ValueError naming the file."""
    from kvcore.probes.ruler.table import RUN_COLUMNS
    from kvcore.sets.records import read_records

    try:
        records = read_records(path, columns)
    except ValueError as exc:
        raise ValueError(str(exc).replace("--resume: ", "--out: ").replace("--csv", "--out")) from None
    rows = [dict(zip(columns, r, strict=True)) for r in records]
    want = {k: str(v) for k, v in run.run_cells().items()}
    for i, r in enumerate(rows):
        other = [c for c in RUN_COLUMNS if r[c] != want[c]]
        if other:
            c = other[0]
            raise ValueError(
                f"--out: {path}:{i + 2} is from another run ({c} {r[c]!r}, this run {want[c]!r}); "
                "give a new --out or the same options"
            )
    return rows


def checkpoint_path(out: Path) -> Path:
    """Where the per-sample scores of the methods still running are kept between rounds (`table.samples.json`)."""
    return out.with_suffix(".samples.json")


def _checkpoint(
    path: Path, key: dict[str, Any], n_items: int, n_ratios: int
) -> dict[int, dict[str, list[float]]]:
    """The scores a checkpoint of this very run holds (none when absent or from another run); ValueError naming
    the file when it is this run's but not as kvlens writes it."""
    if not path.exists():
        return {}
    fix = f"delete {path} (its samples run again)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise ValueError(f"--out: {path} is not a checkpoint kvlens wrote; {fix}") from None
    if not isinstance(data, dict) or data.get("run") != key:
        return {}  # another run's, or other methods': this run starts its samples afresh and replaces it
    scores = data.get("scores")
    out: dict[int, dict[str, list[float]]] = {}
    try:
        for k, by_method in scores.items():
            i = int(k)
            ok = 0 <= i < n_items and set(by_method) == set(key["methods"])
            ok = ok and all(
                len(v) == n_ratios and all(isinstance(x, int | float) and 0 <= x <= 1 for x in v)
                for v in by_method.values()
            )
            if not ok:
                raise ValueError
            out[i] = {m: [float(x) for x in v] for m, v in by_method.items()}
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"--out: {path} holds a score kvlens would not write; {fix}") from None
    return out


def command(args: argparse.Namespace) -> int:
    """Run the table; 0 when done (rank 0 prints and writes it)."""
    from kvcore.atomic import write_text
    from kvcore.engine.session import Session
    from kvcore.measure.export import csv_text, write_json
    from kvcore.probes.ruler.plot import write_svg
    from kvcore.probes.ruler.run import method_row, prepare, score_rounds
    from kvcore.probes.ruler.table import columns, text_table
    from kvcore.sets.ranks import Ranks

    run = _run_spec(args)
    cols = columns(run.ratios, run.tasks)
    ranks = Ranks()
    first = ranks.rank == 0
    kept = _kept_rows(args.out, cols, run) if first else []
    # Rank 0's file decides what is done: another machine need not have it.
    done = set(ranks.gather_json(sorted(r["method"] for r in kept))[0])
    pending = [m for m in run.methods if m not in done]
    key = {**run.run_cells(), "tasks": list(run.tasks), "ratios": list(run.ratios), "methods": pending}
    saved = checkpoint_path(args.out)
    session = Session.load(args.model)
    items = prepare(session, run)  # every sample checked against the model's context before any prefill
    scored = _checkpoint(saved, key, len(items), len(run.ratios)) if first and pending else {}
    scored = {int(k): v for k, v in ranks.gather_json(scored)[0].items()}
    if first and (done or scored):
        print(
            f"kvlens: resuming {args.out}: {len(done)} method rows, {len(scored)} samples kept",
            file=sys.stderr,
        )
    label = f"samples ({run.mode}: {', '.join(pending)})"

    def on_round(so_far: dict[int, dict[str, list[float]]]) -> None:
        if first:
            write_json(saved, {"run": key, "scores": {str(i): v for i, v in sorted(so_far.items())}})
            draw_progress(len(so_far), len(items), label)

    rows: list[dict[str, Any]] = list(
        kept
    )  # rows of methods not asked for now are kept too, after the others
    if pending:
        scored = score_rounds(session, run, items, pending, ranks, scored, on_round)
        rows += [method_row(run, items, scored, m) for m in pending]
    order = {m: i for i, m in enumerate(dict.fromkeys([*run.methods, *(r["method"] for r in kept)]))}
    rows.sort(key=lambda r: order[r["method"]])
    if first:
        end_progress(only_if_drawn=True)
        write_text(args.out, csv_text(rows, cols))
        saved.unlink(missing_ok=True)  # its scores are in the table now
        title = f"RULER-format {run.haystack}, {run.length} tokens, {run.mode}: {session.info.name}"
        print(title)
        print(text_table(rows, run.ratios))
        if args.plot is not None:
            write_svg(args.plot, rows, run.ratios, title)
    ranks.gather(b"")  # every rank waits for rank 0's files: mlx.launch stops the others when one exits
    ranks.finished = True
    return 0
