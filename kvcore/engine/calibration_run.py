"""`kvlens calibrate`'s work: run a model over calibration prompts and fold each prompt's pre-RoPE query statistics
into a method's artifact (kvcore.methods.calibration), written after every prompt so an interrupted run resumes
where it stopped: prompts already folded in (by id) are skipped, and the result is the artifact one run gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvcore.capture.prefill import prefill_with_capture
from kvcore.engine.session import Session
from kvcore.methods import available, calibration, get
from kvcore.model import prompting


@dataclass(frozen=True)
class CalibrationOutcome:
    path: Path
    artifact: calibration.Artifact
    folded: int  # prompts folded in by this run
    skipped: int  # prompts already in the artifact (resume)


def calibrated_methods() -> list[str]:
    """The methods `kvlens calibrate` makes artifacts for."""
    return [n for n in available() if "-" not in n and calibration.needs_artifact(get(n))]


def calibrate(
    session: Session,
    method: str,
    prompts: Sequence[tuple[str, str]],
    out: Path | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> CalibrationOutcome:
    """Fold every (id, text) prompt not yet in `method`'s artifact for this model into it (module docstring).

    ValueError when `method` needs no calibration, or when the file there is not this method's artifact for this
    model (it is left as it is)."""
    names = calibrated_methods()
    if method not in names:
        raise ValueError(f"{method!r} needs no calibration: calibrate one of {', '.join(names)}")
    cls = type(get(method))
    if getattr(cls, "load_calibration", None) is not None:  # an artifact of another kind: its own run
        raise ValueError(f"{method} trains its own artifact: run `kvlens calibrate {method} --prompts DIR`")
    fingerprint = calibration.model_key(session.info.path)
    path = out or calibration.artifact_path(method, fingerprint)
    if path.exists():
        artifact = calibration.read(path, method, fingerprint)
    else:
        artifact = calibration.empty(method, fingerprint, cls.calibration_skip)
    done = set(artifact.done)
    todo = [(i, text) for i, text in prompts if i not in done]
    skipped = len(prompts) - len(todo)
    for k, (prompt_id, text) in enumerate(todo):
        if on_progress is not None:
            on_progress(k, len(todo), prompt_id)
        ids, _ = prompting.encode_prompt(session.tokenizer, text, False, None)
        capture = prefill_with_capture(session.model, ids, window=1, h2o=False, query_stats=True)
        stats = [None if o is None else o.query_stats for o in capture.observations]
        if all(s is None for s in stats):
            raise ValueError(
                f"{method}: no layer's queries passed through a `rope` module KV Lens could tap, so there is "
                "nothing to calibrate on this model: choose another method"
            )
        sample = getattr(cls, "calibration_sample", None)
        samples = None if sample is None else [None if o is None else sample(o) for o in capture.observations]
        artifact = artifact.folded(prompt_id, stats, samples)
        calibration.write(path, artifact)
    if on_progress is not None:
        on_progress(len(todo), len(todo), "done")
    return CalibrationOutcome(path, artifact, len(todo), skipped)
