"""`kvlens sweep --prompts` and `kvlens probe --prompts`: a prompt set × configurations, on one or many ranks.

  kvlens sweep --prompts docs/ --methods snapkv,h2o --ratios 0.25,0.5 --csv set.csv [--resume]
  mlx.launch -n 2 --backend ring -- python -m app sweep --prompts set.jsonl ... --csv set.csv

Every rank loads the model once and runs its share (kvcore.sets.runner); rank 0 alone writes `--csv`, rewritten
after every round, and at the end `<name>.summary.csv` / `.summary.json` (kvcore.sets.summary). Problems found
before any prompt runs (a bad JSONL line, a model that does not load on one machine) exit 2 on every rank; a
prompt that fails is named, the others finish, and rank 0 exits with status 1 (mlx.launch 0.32 itself always
exits 0, and warns "Node with rank 0 exited with code 1").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcore.cli.progress import draw_progress
from kvcore.defaults import UNQUANTIZED_BITS
from kvcore.measure.export import (
    CONFIG_COLUMNS,
    PROMPT_SWEEP_COLUMNS,
    SET_SUMMARY_COLUMNS,
    write_csv,
    write_json,
)
from kvcore.sets.prompt_sets import PromptItem, load_prompts, set_digest
from kvcore.sets.runner import Job, Records, SetResults, encode_rows, read_records, run_jobs, write_records

if TYPE_CHECKING:
    from kvcore.cli.main import PlotWriter

#: A mode's work on one prefilled-or-not prompt: (configuration index, row dicts) per configuration.
ModeRun = Callable[[Any, PromptItem, tuple[int, ...]], Iterator[tuple[int, list[dict[str, Any]]]]]


@dataclass(frozen=True)
class Mode:
    """What differs between `sweep` and `probe` over a prompt set: columns, configurations and the work."""

    columns: tuple[str, ...]
    cells: list[dict[str, Any]]  # CONFIG_COLUMNS cells of each configuration index, as its rows carry them
    run: ModeRun
    needs_answers: bool


def sweep_mode(args: argparse.Namespace, configs: Sequence[Any]) -> Mode:
    """Each configuration's (layer, kv-head) rows with the summary metrics and recall against `answer`."""
    from kvcore.engine.sweep import run_sweep
    from kvcore.probes.base import writes_answer

    def run(session: Any, item: PromptItem, todo: tuple[int, ...]) -> Iterator[tuple[int, list[dict]]]:
        session.prefill(
            item.text, args.tokens, chat_template=args.chat_template, system_prompt=args.system_prompt
        )
        for i, point in zip(todo, run_sweep(session, [configs[i] for i in todo]), strict=True):
            text = session.tokenizer.decode(list(point.tokens))
            recalled = None if item.answer is None else writes_answer(item.answer, text)
            yield i, [{**row, "prompt": item.id, "recalled": recalled} for row in point.csv_rows()]

    cells = [_config_cells(c, c.group_size if c.quantized else "") for c in configs]
    return Mode(PROMPT_SWEEP_COLUMNS, cells, run, needs_answers=False)


def probe_mode(args: argparse.Namespace, configs: Sequence[Any]) -> Mode:
    """The dense cache's row (index 0) and one row per configuration, recall scored on `answer`."""
    from kvcore.probes.base import Probe
    from kvcore.probes.run import DENSE, PROMPT_PROBE_COLUMNS, config_rows, dense_row

    def run(session: Any, item: PromptItem, todo: tuple[int, ...]) -> Iterator[tuple[int, list[dict]]]:
        probe = Probe(item.text, item.answer or "", name="", family="", seed=None, depth=None, n_tokens=None)
        session.prefill(
            item.text,
            probe.max_new_tokens,
            chat_template=args.chat_template,
            system_prompt=args.system_prompt,
        )
        for i in todo:
            rows = [dense_row(session, probe)] if i == 0 else config_rows(session, probe, [configs[i - 1]])
            yield i, [{**row, "prompt": item.id} for row in rows]

    cells = [_cells(DENSE, "", 1.0, UNQUANTIZED_BITS, UNQUANTIZED_BITS, 0, "")]
    cells += [_config_cells(c, c.group_size) for c in configs]
    return Mode(PROMPT_PROBE_COLUMNS, cells, run, needs_answers=True)


def _config_cells(c: Any, group_size: int | str) -> dict[str, Any]:
    return _cells(c.method, c.schedule, c.ratio, *c.widths, c.fp_recent, group_size)


def _cells(
    method: str,
    schedule: str,
    ratio: float,
    key_bits: int,
    value_bits: int,
    fp_recent: int,
    group_size: int | str,
) -> dict[str, Any]:
    values = (method, schedule, ratio, key_bits, value_bits, fp_recent, group_size)
    return dict(zip(CONFIG_COLUMNS, values, strict=True))


def summary_paths(csv_path: Path) -> tuple[Path, Path]:
    """Where the per-configuration summary goes: beside the results, `<stem>.summary.csv` and `.summary.json`."""
    return csv_path.with_suffix(".summary.csv"), csv_path.with_suffix(".summary.json")


def run(
    args: argparse.Namespace,
    mode: Mode,
    check: Callable[[Any, int], None],
    plot_writer: PlotWriter | None = None,
) -> int:
    """Load, agree across ranks, run, write (rank 0). `check(session, rank)` refuses bad configurations and,
    on rank 0, a bad output path (ValueError). `plot_writer` draws `--plot` from the summary (rank 0)."""
    from kvcore.sets.ranks import Ranks

    ranks = Ranks()
    setup: dict[str, Any] = {"error": None, "digest": None, "weights": None, "done": []}
    items: list[PromptItem] = []
    session = None
    try:
        items = load_prompts(args.prompts)
        if mode.needs_answers and (missing := [p.id for p in items if p.answer is None]):
            raise ValueError(
                f"--prompts {args.prompts}: probe scores recall, and {missing[0]!r} has no answer; use a .jsonl "
                'with "answer" on every line, or kvlens sweep --prompts'
            )
        from kvcore.engine.session import Session

        session = Session.load(args.model)
        check(session, ranks.rank)
        setup["digest"], setup["weights"] = set_digest(items), _weights(session, items, args, len(mode.cells))
        if ranks.rank == 0 and args.resume and args.csv is not None:
            setup["done"] = sorted(_place(read_records(args.csv, mode.columns), items, mode).rows)
    except ValueError as exc:  # ModelLoadError is one too
        setup["error"] = str(exc)
    agreed = _agree(ranks, setup)
    done = {tuple(k) for k in agreed["done"]}
    results = SetResults()
    if ranks.rank == 0 and args.resume and args.csv is not None:
        results = _place(read_records(args.csv, mode.columns), items, mode)
    jobs = [
        Job(p, todo, weight)
        for p, weight in enumerate(agreed["weights"])
        if (todo := tuple(c for c in range(len(mode.cells)) if (p, c) not in done))
    ]
    total = len(items) * len(mode.cells)

    def evaluate(job: Job) -> Iterator[tuple[int, Records]]:
        for i, rows in mode.run(session, items[job.prompt], job.configs):
            records = encode_rows(rows, mode.columns)
            _check_key(records, items[job.prompt], mode, i)
            yield i, records

    def on_round(res: SetResults) -> None:
        if ranks.rank == 0:
            if args.csv is not None:
                write_records(args.csv, mode.columns, res.records())
            _progress(len(res.rows), total, len(res.errors), ranks.size)

    run_jobs(jobs, evaluate, ranks, results, lambda p: repr(items[p].id), on_round)
    status = 0
    if ranks.rank == 0:
        sys.stderr.write("\n")
        status = _finish(args, mode, results, len(items), ranks, plot_writer)
    # mlx.launch stops every rank as soon as one exits non-zero: no rank leaves before rank 0 has written, and
    # only rank 0 reports the failure status (the others' rows are in its files).
    ranks.gather(b"")
    return status


def _weights(session: Any, items: list[PromptItem], args: argparse.Namespace, n_configs: int) -> list[int]:
    """Token count × (configurations + 1) per prompt; a prompt that does not encode weighs 1 (it fails fast)."""
    out = []
    for item in items:
        try:
            n = len(session.encode(item.text, args.chat_template, args.system_prompt))
        except ValueError:
            n = 1
        out.append(n * (n_configs + 1))
    return out


def _agree(ranks: Any, setup: dict[str, Any]) -> dict[str, Any]:
    """Share every rank's set-up; ValueError on every rank if any failed or they read different prompts."""
    import json

    parts = [json.loads(p) for p in ranks.gather(json.dumps(setup).encode("utf-8"))]
    for r, part in enumerate(parts):
        if part["error"] is not None:
            raise ValueError(part["error"] if ranks.size == 1 else f"rank {r}: {part['error']}")
    if len({p["digest"] for p in parts}) > 1:
        raise ValueError(
            "the ranks read different prompt sets: copy --prompts to the same path on every machine"
        )
    if len({tuple(p["weights"]) for p in parts}) > 1:
        raise ValueError("the ranks count tokens differently: load the same --model on every machine")
    return parts[0]


def _key_table(items: list[PromptItem], mode: Mode) -> dict[tuple[str, ...], tuple[int, int]]:
    configs = encode_rows(mode.cells, CONFIG_COLUMNS)
    return {(p.id, *cells): (i, c) for i, p in enumerate(items) for c, cells in enumerate(configs)}


def _row_key(record: list[str], columns: Sequence[str]) -> tuple[str, ...]:
    return tuple(record[columns.index(c)] for c in ("prompt", *CONFIG_COLUMNS))


def _place(records: Records, items: list[PromptItem], mode: Mode) -> SetResults:
    """An earlier file's rows by (prompt, configuration); ValueError for a row this run does not plan."""
    table, results = _key_table(items, mode), SetResults()
    for record in records:
        key = _row_key(record, mode.columns)
        if key not in table:
            raise ValueError(
                f"--resume: the file has a row for prompt {key[0]!r}, {' '.join(key[1:])} that this run does not "
                "include; pass the same --prompts and configurations, or give a new --csv"
            )
        results.rows.setdefault(table[key], []).append(record)
    return results


def _check_key(records: Records, item: PromptItem, mode: Mode, config: int) -> None:
    expected = (item.id, *encode_rows([mode.cells[config]], CONFIG_COLUMNS)[0])
    if any(_row_key(r, mode.columns) != expected for r in records):
        raise RuntimeError(f"rows of configuration {config} do not carry its cells {expected}: a kvcore bug")


def _progress(done: int, total: int, failed: int, size: int) -> None:
    tail = f"; {failed} prompt{'s' if failed != 1 else ''} failed" if failed else ""
    ranks = f" on {size} ranks" if size > 1 else ""
    draw_progress(done, total, f"(prompt, configuration){ranks}{tail}")


def _finish(
    args: argparse.Namespace,
    mode: Mode,
    results: SetResults,
    n_prompts: int,
    ranks: Any,
    plot_writer: PlotWriter | None,
) -> int:
    from kvcore.sets.summary import summary_rows

    records = results.records()
    rows = [dict(zip(mode.columns, r, strict=True)) for r in records]
    summary = summary_rows(rows)
    if args.csv is not None:
        write_records(args.csv, mode.columns, records)
        csv_path, json_path = summary_paths(args.csv)
        write_csv(csv_path, summary, SET_SUMMARY_COLUMNS)
        write_json(json_path, _summary_json(summary))
    plotted = _plot(args, summary, plot_writer)
    _print_summary(summary)
    moved = f"; {ranks.bytes_moved} bytes moved between {ranks.size} ranks" if ranks.size > 1 else ""
    outputs = [str(p) for p in (args.csv, plotted) if p is not None]
    written = f" written to {', '.join(outputs)}" if outputs else ""
    print(f"{n_prompts} prompts × {len(mode.cells)} configurations; {len(records)} rows{written}{moved}")
    for message in results.errors.values():
        print(f"kvlens: error: {' '.join(message.split())}", file=sys.stderr)
    unplotted = getattr(args, "plot", None) is not None and plotted is None
    return 1 if results.errors or unplotted else 0


def _plot(
    args: argparse.Namespace,
    summary: list[dict[str, Any]],
    plot_writer: PlotWriter | None,
) -> Path | None:
    """`--plot`: the summary's frontier (one point per configuration at its mean, its interval as an error bar).
    Nothing to draw (every prompt failed) is said on stderr; the run's status already reports the failures."""
    path = getattr(args, "plot", None)
    if path is None or plot_writer is None:
        return None
    from kvcore.sets.results_file import points_from_summary

    try:
        points = points_from_summary(summary)
    except ValueError as exc:
        print(f"kvlens: error: --plot {path} not written: {exc}", file=sys.stderr)
        return None
    plot_writer(points, path, args.metric)
    return path


def _summary_json(summary: list[dict[str, Any]]) -> dict[str, Any]:
    from kvcore.defaults import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE

    def typed(v: Any) -> Any:
        if v == "":
            return None
        if isinstance(v, str):
            for kind in (int, float):
                try:
                    return kind(v)
                except ValueError:
                    pass
        return v

    return {
        "confidence": CONFIDENCE,
        "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
        "bootstrap_seed": BOOTSTRAP_SEED,
        "configurations": [{k: typed(v) for k, v in row.items()} for row in summary],
    }


def _print_summary(summary: list[dict[str, Any]]) -> None:
    for row in summary:
        label = f"{row['method']} r={row['retention_ratio']} bits=K{row['key_bits']}/V{row['value_bits']} fp={row['fp_recent']}"
        parts = [
            f"{name} {row[f'{name}_mean']:.4g} [{row[f'{name}_low']:.4g}, {row[f'{name}_high']:.4g}]"
            for name in ("kl", "agreement", "nll_delta", "recall")
            if row[f"{name}_mean"] is not None
        ]
        if row["compression_ratio_mean"] is not None:
            parts.append(f"memory {100 * row['compression_ratio_mean']:.1f} % of dense")
        print(f"{label:>36} ({row['prompts']} prompts): {'; '.join(parts)}")
