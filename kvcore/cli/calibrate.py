"""`kvlens calibrate METHOD --model M --prompts DIR [--out FILE]`: a calibrated method's artifact for a model.

The prompts are a folder of .txt/.md/.py files or a .jsonl file (kvcore.sets.prompt_sets); the artifact goes to the
user data folder, keyed by the model's fingerprint, where the method finds it (or to --out). A progress bar runs on
stderr; running the command again resumes: prompts already folded in are skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvcore.cli.progress import draw_progress, end_progress


def add_parser(sub: argparse._SubParsersAction, default_model: str) -> None:
    """Register the subcommand on `kvlens`'s subparsers."""
    s = sub.add_parser(
        "calibrate",
        help="compute a calibrated method's artifact (qfilter, expected_attention_stats) for a model",
    )
    s.add_argument(
        "calibrated_method",
        metavar="METHOD",
        help="a calibrated method: qfilter, expected_attention_stats or duo_attention_calibrated",
    )
    s.add_argument("--model", default=default_model, help="model folder or HF repo id (default: demo)")
    s.add_argument(
        "--prompts", type=Path, required=True, help="calibration prompts: a folder of text files or a .jsonl"
    )
    s.add_argument("--out", type=Path, help="write the artifact here instead of the user data folder")


def run(args: argparse.Namespace) -> int:
    """Load the prompts (checked first), then the model, and calibrate; ValueError / OSError go to main's handler."""
    from kvcore.engine.calibration_run import calibrate, calibrated_methods
    from kvcore.engine.session import Session
    from kvcore.sets.prompt_sets import load_prompts

    method = args.calibrated_method
    if method not in calibrated_methods():
        raise ValueError(
            f"{method!r} needs no calibration: calibrate one of {', '.join(calibrated_methods())}"
        )
    items = load_prompts(args.prompts)
    session = Session.load(args.model)

    def progress(done: int, total: int, label: str) -> None:
        draw_progress(done, total, label)

    outcome = calibrate(session, method, [(p.id, p.text) for p in items], args.out, progress)
    end_progress()
    what = f"{outcome.folded} prompt{'s' if outcome.folded != 1 else ''} folded in"
    if outcome.skipped:
        what += f", {outcome.skipped} already there (resumed)"
    print(
        f"{outcome.path}: {method} calibration of {session.info.name}, {outcome.artifact.n_prompts} prompts ({what})"
    )
    sys.stdout.flush()
    return 0
