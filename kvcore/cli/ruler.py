"""`kvlens ruler`: RULER-format tasks scored per method and compression ratio, as kvpress's leaderboard.

  kvlens ruler --model M --length 4096 --methods dense,snapkv,knorm --ratios 0.25,0.5,0.75,0.875 \\
      [--query-aware] [--haystack code|noise] [--samples 20] [--tasks niah_single,vt] --out table.csv [--plot p.svg]

The table (one row per method; per compression ratio the mean over tasks, then each task) is printed and written
to --out atomically after every method; an existing --out of the same run is resumed: its methods are kept and
skipped. Progress goes to stderr. Under `mlx.launch` the samples are spread over the ranks and rank 0 writes.
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
    from kvcore.methods import available
    from kvcore.probes.ruler import tasks
    from kvcore.probes.ruler.run import RulerRun
    from kvcore.probes.ruler.table import DENSE

    methods = tuple(dict.fromkeys(m.strip() for m in args.methods.split(",") if m.strip()))
    for m in methods:
        if m != DENSE and m not in available():
            raise ValueError(
                f"--methods: unknown method {m!r}; use {DENSE} or one of {', '.join(available())}"
            )
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


def command(args: argparse.Namespace) -> int:
    """Run the table; 0 when done (rank 0 prints and writes it, after every method)."""
    from kvcore.atomic import write_text
    from kvcore.engine.session import Session
    from kvcore.measure.export import csv_text
    from kvcore.probes.ruler.plot import write_svg
    from kvcore.probes.ruler.run import method_row, prepare
    from kvcore.probes.ruler.table import columns, text_table
    from kvcore.sets.ranks import Ranks

    run = _run_spec(args)
    cols = columns(run.ratios, run.tasks)
    ranks = Ranks()
    kept = _kept_rows(args.out, cols, run) if ranks.rank == 0 else []
    # Rank 0's file decides what is done: another machine need not have it.
    done = set(json.loads(ranks.gather(json.dumps(sorted(r["method"] for r in kept)).encode("utf-8"))[0]))
    if done and ranks.rank == 0:
        print(f"kvlens: resuming {args.out}: {len(done)} method rows kept", file=sys.stderr)
    session = Session.load(args.model)
    items = prepare(session, run)  # every sample checked against the model's context before any prefill
    rows: list[dict[str, Any]] = list(
        kept
    )  # rows of methods not asked for now are kept too, after the others
    order = {m: i for i, m in enumerate(dict.fromkeys([*run.methods, *(r["method"] for r in kept)]))}
    progress = draw_progress if ranks.rank == 0 else None
    for method in run.methods:
        if method in done:
            continue
        rows.append(method_row(session, run, items, method, ranks, progress))
        rows.sort(key=lambda r: order[r["method"]])
        if ranks.rank == 0:
            write_text(args.out, csv_text(rows, cols))
    if ranks.rank == 0:
        end_progress(only_if_drawn=True)
        title = f"RULER-format {run.haystack}, {run.length} tokens, {run.mode}: {session.info.name}"
        print(title)
        print(text_table(rows, run.ratios))
        if args.plot is not None:
            write_svg(args.plot, rows, run.ratios, title)
    ranks.gather(b"")  # every rank waits for rank 0's files: mlx.launch stops the others when one exits
    ranks.finished = True
    return 0
