"""A prompt set evaluated over configurations, on this process or across the ranks of `mlx.launch`.

Every rank loads the model once and runs its share (kvcore.sets.rounds); rank 0 alone writes the results file,
rewritten after every round, and at the end `<name>.summary.csv` / `.summary.json` (kvcore.sets.summary) and the
plot. Problems found before any prompt runs (a bad JSONL line, a model that does not load on one machine) raise
ValueError on every rank; a prompt that fails is named in the outcome and the others finish.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcore.measure.export import CONFIG_COLUMNS, SET_SUMMARY_COLUMNS, write_csv, write_json
from kvcore.measure.frontier import DEFAULT_METRIC, PlotWriter
from kvcore.sets.modes import Mode
from kvcore.sets.prompt_sets import PromptItem, load_prompts, set_digest
from kvcore.sets.records import Records, encode_rows, read_records, write_records
from kvcore.sets.rounds import Job, SetResults, run_rounds
from kvcore.sets.summary import summary_json, summary_paths, summary_rows

#: Called on rank 0 after every round: (pairs done, pairs in all, prompts failed, ranks).
Progress = Callable[[int, int, int, int], None]
#: Refuses what the loaded model cannot run (ValueError): (session, rank). Rank 0 also checks its output paths.
Check = Callable[[Any, int], None]


@dataclass(frozen=True)
class SetRequest:
    """Which prompts, model and files: `csv` is rewritten after every round and keeps its rows with `resume`;
    `plot` draws the summary's frontier on `metric`; the prompts go through the chat template as `prefill` does."""

    prompts: Path
    model: str
    csv: Path | None = None
    resume: bool = False
    plot: Path | None = None
    metric: str = DEFAULT_METRIC
    chat_template: bool = True
    system_prompt: str | None = None


@dataclass(frozen=True)
class SetOutcome:
    """What rank 0 holds when the set is done: the summary, the counts, the files written and what failed."""

    summary: list[dict[str, Any]]
    n_prompts: int
    n_configs: int
    n_rows: int
    written: tuple[Path, ...]  # the results file and the plot, those written, in that order
    errors: tuple[str, ...]  # one message per failed prompt
    plot_error: str | None  # why `plot` was not drawn (every prompt failed), None when drawn or not asked for
    unplotted: bool  # a plot was asked for and none was drawn
    n_ranks: int
    bytes_moved: int

    @property
    def failed(self) -> bool:
        """A prompt failed or the plot asked for was not drawn."""
        return bool(self.errors) or self.unplotted


def evaluate_set(
    request: SetRequest,
    mode: Mode,
    check: Check,
    plot_writer: PlotWriter | None = None,
    on_progress: Progress | None = None,
) -> SetOutcome | None:
    """Load, agree across ranks, run, write (rank 0); the outcome on rank 0, None on the others.

    Returns only once every rank is done and rank 0 has written: mlx.launch stops every rank as soon as one exits
    non-zero, so no rank may leave before the files are whole."""
    from kvcore.sets.ranks import Ranks

    ranks = Ranks()
    setup: dict[str, Any] = {"error": None, "digest": None, "weights": None, "done": []}
    items: list[PromptItem] = []
    session = None
    try:
        items = load_prompts(request.prompts)
        if mode.needs_answers and (missing := [p.id for p in items if p.answer is None]):
            raise ValueError(
                f"--prompts {request.prompts}: probe scores recall, and {missing[0]!r} has no answer; use a .jsonl "
                'with "answer" on every line, or kvlens sweep --prompts'
            )
        if not mode.takes_questions and (asked := [p.id for p in items if p.question is not None]):
            raise ValueError(
                f"--prompts {request.prompts}: {asked[0]!r} is a question about a context, scored by recall: run "
                "kvlens probe --prompts (or kvlens compress --context-file C --questions Q.jsonl)"
            )
        from kvcore.engine.session import Session

        session = Session.load(request.model)
        check(session, ranks.rank)
        setup["digest"] = set_digest(items)
        setup["weights"] = _weights(session, items, request, len(mode.cells))
        if ranks.rank == 0 and request.resume and request.csv is not None:
            setup["done"] = sorted(_place(read_records(request.csv, mode.columns), items, mode).rows)
    except ValueError as exc:  # ModelLoadError is one too
        setup["error"] = str(exc)
    agreed = _agree(ranks, setup)
    done = {tuple(k) for k in agreed["done"]}
    results = SetResults()
    if ranks.rank == 0 and request.resume and request.csv is not None:
        results = _place(read_records(request.csv, mode.columns), items, mode)
    jobs = [
        Job(p, todo, weight)
        for p, weight in enumerate(agreed["weights"])
        if (todo := tuple(c for c in range(len(mode.cells)) if (p, c) not in done))
    ]
    total = len(items) * len(mode.cells)

    def evaluate(job: Job) -> Iterator[tuple[int, Records]]:
        for i, rows in mode.evaluate_prompt(session, items[job.prompt], job.configs):
            records = encode_rows(rows, mode.columns)
            _check_key(records, items[job.prompt], mode, i)
            yield i, records

    def on_round(res: SetResults) -> None:
        if ranks.rank == 0:
            if request.csv is not None:
                write_records(request.csv, mode.columns, res.records())
            if on_progress is not None:
                on_progress(len(res.rows), total, len(res.errors), ranks.size)

    run_rounds(jobs, evaluate, ranks, results, lambda p: repr(items[p].id), on_round)
    outcome = _finish(request, mode, results, len(items), ranks, plot_writer) if ranks.rank == 0 else None
    ranks.gather(b"")  # every rank waits for rank 0's files
    ranks.finished = True
    return outcome


def _weights(session: Any, items: list[PromptItem], request: SetRequest, n_configs: int) -> list[int]:
    """Token count × (configurations + 1) per prompt; a prompt that does not encode weighs 1 (it fails fast)."""
    out = []
    for item in items:
        try:
            n = len(session.encode(item.text, request.chat_template, request.system_prompt))
        except ValueError:
            n = 1
        out.append(n * (n_configs + 1))
    return out


def _agree(ranks: Any, setup: dict[str, Any]) -> dict[str, Any]:
    """Share every rank's set-up; ValueError on every rank if any failed or they read different prompts."""
    parts = ranks.gather_json(setup)
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
    return {(_id_cell(p.id), *cells): (i, c) for i, p in enumerate(items) for c, cells in enumerate(configs)}


def _id_cell(prompt_id: str) -> str:
    """A prompt id as its rows' `prompt` cell holds it (neutralised like every text cell: `=x` -> `'=x`)."""
    return encode_rows([{"prompt": prompt_id}], ("prompt",))[0][0]


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
    sizes = {len(rows) for rows in results.rows.values()}
    if len(sizes) > 1:  # every (prompt, configuration) of a mode writes as many rows: one was cut or deleted
        full = max(sizes)
        (p, c), short = next((k, v) for k, v in sorted(results.rows.items()) if len(v) < full)
        raise ValueError(
            f"--resume: the file has {len(short)} rows for prompt {items[p].id!r}, configuration {c + 1}, the "
            f"others {full}: rows were cut or deleted; delete that prompt's rows (they run again) or give a new --csv"
        )
    return results


def _check_key(records: Records, item: PromptItem, mode: Mode, config: int) -> None:
    expected = (_id_cell(item.id), *encode_rows([mode.cells[config]], CONFIG_COLUMNS)[0])
    if any(_row_key(r, mode.columns) != expected for r in records):
        raise RuntimeError(f"rows of configuration {config} do not carry its cells {expected}: a kvcore bug")


def _finish(
    request: SetRequest,
    mode: Mode,
    results: SetResults,
    n_prompts: int,
    ranks: Any,
    plot_writer: PlotWriter | None,
) -> SetOutcome:
    """Rank 0: the results file in order, its summary beside it, the plot."""
    records = results.records()
    summary = summary_rows([dict(zip(mode.columns, r, strict=True)) for r in records])
    if request.csv is not None:
        write_records(request.csv, mode.columns, records)
        csv_path, json_path = summary_paths(request.csv)
        write_csv(csv_path, summary, SET_SUMMARY_COLUMNS)
        write_json(json_path, summary_json(summary))
    plotted, plot_error = _plot(request, summary, plot_writer)
    return SetOutcome(
        summary=summary,
        n_prompts=n_prompts,
        n_configs=len(mode.cells),
        n_rows=len(records),
        written=tuple(p for p in (request.csv, plotted) if p is not None),
        errors=tuple(results.errors.values()),
        plot_error=plot_error,
        unplotted=request.plot is not None and plotted is None,
        n_ranks=ranks.size,
        bytes_moved=ranks.bytes_moved,
    )


def _plot(
    request: SetRequest, summary: list[dict[str, Any]], plot_writer: PlotWriter | None
) -> tuple[Path | None, str | None]:
    """`plot`: the summary's frontier (one point per configuration at its mean, its interval as an error bar).
    (the path drawn, None) or, with nothing to draw (every prompt failed), (None, why)."""
    if request.plot is None or plot_writer is None:
        return None, None
    from kvcore.sets.results_file import points_from_summary

    try:
        points = points_from_summary(summary)
    except ValueError as exc:
        return None, str(exc)
    plot_writer(points, request.plot, request.metric)
    return request.plot, None
