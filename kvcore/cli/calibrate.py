"""`kvlens calibrate METHOD --model M --prompts DIR [--out FILE]`: a calibrated method's artifact for a model.

The prompts are a folder of .txt/.md/.py files or a .jsonl file (kvcore.sets.prompt_sets); the artifact goes to the
user data folder, keyed by the model's fingerprint, where the method finds it (or to --out). A progress bar runs on
stderr; running the command again resumes: prompts already folded in are skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvcore.cli.progress import draw_progress, end_progress
from kvcore.defaults import KVZAP_EPOCHS, KVZAP_HIDDEN_DIM, KVZAP_POSITIONS, KVZAP_SEED


def add_parser(sub: argparse._SubParsersAction, default_model: str) -> None:
    """Register the subcommand on `kvlens`'s subparsers."""
    s = sub.add_parser(
        "calibrate",
        help="compute a calibrated method's artifact (qfilter, expected_attention_stats, kvzap...) for a model",
    )
    s.add_argument(
        "calibrated_method",
        metavar="METHOD",
        help="a calibrated method: qfilter, expected_attention_stats, duo_attention_calibrated or kvzap",
    )
    s.add_argument("--model", default=default_model, help="model folder or HF repo id (default: demo)")
    s.add_argument(
        "--prompts", type=Path, required=True, help="calibration prompts: a folder of text files or a .jsonl"
    )
    s.add_argument("--out", type=Path, help="write the artifact here instead of the user data folder")
    k = s.add_argument_group("kvzap (a surrogate trained on kvzip+ scores)")
    k.add_argument(
        "--kvzap-type", choices=("mlp", "linear"), default="mlp", help="the surrogate (default: mlp)"
    )
    k.add_argument("--kvzap-hidden-dim", type=int, default=KVZAP_HIDDEN_DIM, help="the mlp's hidden width")
    k.add_argument(
        "--kvzap-epochs",
        type=int,
        default=KVZAP_EPOCHS,
        help="the mlp's training epochs (linear: a closed-form fit)",
    )
    k.add_argument(
        "--kvzap-positions", type=int, default=KVZAP_POSITIONS, help="positions sampled from each prompt"
    )
    k.add_argument("--kvzap-seed", type=int, default=KVZAP_SEED, help="sampling and training seed")


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
    kvzap_options = (
        args.kvzap_type,
        args.kvzap_hidden_dim,
        args.kvzap_epochs,
        args.kvzap_positions,
        args.kvzap_seed,
    )
    if method != "kvzap" and kvzap_options != (
        "mlp",
        KVZAP_HIDDEN_DIM,
        KVZAP_EPOCHS,
        KVZAP_POSITIONS,
        KVZAP_SEED,
    ):
        raise ValueError(f"the --kvzap-* options set kvzap's training, not {method}'s: leave them out")
    if args.kvzap_type == "linear" and (args.kvzap_hidden_dim, args.kvzap_epochs) != (
        KVZAP_HIDDEN_DIM,
        KVZAP_EPOCHS,
    ):
        raise ValueError(
            "--kvzap-hidden-dim and --kvzap-epochs set the mlp's training; the linear surrogate is a closed-form "
            "ridge fit (as kvpress's): leave them out"
        )
    items = load_prompts(args.prompts)
    session = Session.load(args.model)
    if method == "kvzap":
        return _run_kvzap(args, session, [(p.id, p.text) for p in items])

    def progress(done: int, total: int, label: str) -> None:
        draw_progress(done, total, label)

    outcome = calibrate(session, method, [(p.id, p.text) for p in items], args.out, progress)
    end_progress()
    what = _counted(outcome.folded, "folded in", outcome.skipped)
    print(
        f"{outcome.path}: {method} calibration of {session.info.name}, {outcome.artifact.n_prompts} prompts ({what})"
    )
    sys.stdout.flush()
    return 0


def _run_kvzap(args: argparse.Namespace, session: Any, prompts: list[tuple[str, str]]) -> int:
    """Collect, train and write kvzap's surrogate, the training's progress on stderr."""
    from kvcore.engine.kvzap_calibration import calibrate_kvzap
    from kvcore.methods.kvzap_training import TrainingSettings

    settings = TrainingSettings(
        model_type=args.kvzap_type,
        hidden_dim=args.kvzap_hidden_dim,
        epochs=args.kvzap_epochs,
        seed=args.kvzap_seed,
    )

    def epoch(done: int, total: int, loss: float, held: float | None, r2: float | None) -> None:
        tail = "" if held is None else f", held-out MSE {held:.4f}, R² {r2:.3f}"
        sys.stderr.write(f"kvzap {settings.model_type}: epoch {done}/{total} train MSE {loss:.4f}{tail}\n")

    def progress(done: int, total: int, label: str) -> None:
        draw_progress(done, total, label)
        if done == total:
            end_progress()

    outcome = calibrate_kvzap(session, prompts, settings, args.kvzap_positions, args.out, progress, epoch)
    header = outcome.surrogate.header
    figures = f"{header['rows']} rows"
    if header["held_out_r2"] is not None:
        jaccard = ", ".join(f"{float(r):.0%} {v:.3f}" for r, v in header["jaccard_vs_kvzip"].items())
        figures += f", held-out R² {header['held_out_r2']:.3f}, Jaccard vs kvzip+ {jaccard}"
    what = _counted(outcome.collected, "collected", outcome.skipped)
    print(
        f"{outcome.path}: kvzap {settings.model_type} surrogate, {header['n_prompts']} prompts ({what}); {figures}"
    )
    sys.stdout.flush()
    return 0


def _counted(done: int, verb: str, skipped: int) -> str:
    """ "2 prompts folded in, 1 already there (resumed)"."""
    what = f"{done} prompt{'s' if done != 1 else ''} {verb}"
    return what + (f", {skipped} already there (resumed)" if skipped else "")
