"""`kvlens sweep --prompts` and `kvlens probe --prompts`: a prompt set × configurations, on one or many ranks.

  kvlens sweep --prompts docs/ --methods snapkv,h2o --ratios 0.25,0.5 --csv set.csv [--resume]
  mlx.launch -n 2 --backend ring -- python -m app sweep --prompts set.jsonl ... --csv set.csv

The arguments become a kvcore.sets.evaluation request; this module draws its progress and prints its outcome.
Rank 0 alone writes `--csv`, rewritten after every round, and at the end `<name>.summary.csv` / `.summary.json`.
Problems found before any prompt runs (a bad JSONL line, a model that does not load on one machine) exit 2 on
every rank; a prompt that fails is named, the others finish, and rank 0 exits with status 1 (mlx.launch 0.32
itself always exits 0, and warns "Node with rank 0 exited with code 1").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from kvcore.cli.progress import draw_progress, end_progress
from kvcore.measure.frontier import DEFAULT_METRIC, PlotWriter
from kvcore.sets.evaluation import Check, SetOutcome, SetRequest, evaluate_set
from kvcore.sets.modes import probe_mode, sweep_mode
from kvcore.sets.summary import few_prompts_note

#: The metrics a printed summary gives with their interval.
INTERVALS: tuple[str, ...] = ("kl", "agreement", "nll_delta", "recall")


def prompt_set_command(
    args: argparse.Namespace, configs: Sequence[Any], check: Check, plot_writer: PlotWriter | None = None
) -> int:
    """Evaluate `--prompts` over `configs` (probe or sweep, as `args.command` says); the exit status."""
    if args.command == "probe":
        mode = probe_mode(
            configs, args.chat_template, args.system_prompt, getattr(args, "query_aware", False)
        )
    else:
        mode = sweep_mode(configs, args.tokens, args.chat_template, args.system_prompt)
    request = SetRequest(
        prompts=args.prompts,
        model=args.model,
        csv=args.csv,
        resume=args.resume,
        plot=getattr(args, "plot", None),
        metric=getattr(args, "metric", DEFAULT_METRIC),
        chat_template=args.chat_template,
        system_prompt=args.system_prompt,
    )
    outcome = evaluate_set(request, mode, check, plot_writer, _progress)
    if outcome is None:  # not rank 0: rank 0 reports for every rank
        return 0
    end_progress()
    _print_outcome(outcome, request)
    return 1 if outcome.failed else 0


def _progress(done: int, total: int, failed: int, size: int) -> None:
    tail = f"; {failed} prompt{'s' if failed != 1 else ''} failed" if failed else ""
    ranks = f" on {size} ranks" if size > 1 else ""
    draw_progress(done, total, f"(prompt, configuration){ranks}{tail}")


def _print_outcome(outcome: SetOutcome, request: SetRequest) -> None:
    if outcome.plot_error is not None:
        print(f"kvlens: error: --plot {request.plot} not written: {outcome.plot_error}", file=sys.stderr)
    _print_summary(outcome.summary)
    moved = (
        f"; {outcome.bytes_moved} bytes moved between {outcome.n_ranks} ranks" if outcome.n_ranks > 1 else ""
    )
    written = f" written to {', '.join(map(str, outcome.written))}" if outcome.written else ""
    print(
        f"{outcome.n_prompts} prompts × {outcome.n_configs} configurations; {outcome.n_rows} rows{written}{moved}"
    )
    for message in outcome.errors:
        print(f"kvlens: error: {' '.join(message.split())}", file=sys.stderr)


def _print_summary(summary: list[dict[str, Any]]) -> None:
    for row in summary:
        label = f"{row['method']} r={row['retention_ratio']} bits=K{row['key_bits']}/V{row['value_bits']} fp={row['fp_recent']}"
        parts = [
            f"{name} {row[f'{name}_mean']:.4g} [{row[f'{name}_low']:.4g}, {row[f'{name}_high']:.4g}]"
            for name in INTERVALS
            if row[f"{name}_mean"] is not None
        ]
        if row["compression_ratio_mean"] is not None:
            parts.append(f"memory {100 * row['compression_ratio_mean']:.1f} % of dense")
        note = (
            few_prompts_note(row["prompts"]) if any(row[f"{n}_mean"] is not None for n in INTERVALS) else ""
        )
        print(f"{label:>36} ({row['prompts']} prompts): {'; '.join(parts)}" + (f" {note}" if note else ""))
