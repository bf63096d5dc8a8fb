"""Generate N says "k of N" as it goes, and a cancel part way keeps the tokens generated until then: the same
tokens an uninterrupted Generate makes first (a real Session on the llama test model)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from app.engine import jobs
from kvcore.capture.prefill import Cancelled
from kvcore.engine.session import Session

PROMPT = "def area(width, height):\n    return width * height\n"


@dataclass
class _Context:
    """What an extend job uses of a JobContext: the engine state, progress reports and a cancel flag."""

    state: dict
    cancel_after: int | None = None  # cancel once this many progress reports were made
    reports: list[tuple[float, str]] = field(default_factory=list)

    def progress(self, fraction: float, text: str = "") -> None:
        self.reports.append((fraction, text))

    def cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.reports) > self.cancel_after


def _session(model_dirs) -> Session:
    session = Session.load(str(model_dirs["llama"]))
    session.prefill(PROMPT, n_tokens=2)
    return session


def test_generate_reports_k_of_n_and_a_cancel_keeps_what_was_generated(model_dirs):
    n = 32
    full = _session(model_dirs)
    ctx = _Context({jobs.SESSION: full})
    view = jobs.extend(n)(ctx)
    assert not view.cut_short and len(full.dense_tokens) == 2 + n
    texts = [text for _, text in ctx.reports]
    assert texts[0] == f"Generating: 0 of {n} tokens" and len(texts) == jobs.EXTEND_CHUNKS
    assert texts[-1] == f"Generating: {n - n // jobs.EXTEND_CHUNKS} of {n} tokens"

    cut = _session(model_dirs)
    ctx = _Context({jobs.SESSION: cut}, cancel_after=3)
    view = jobs.extend(n)(ctx)
    kept = len(cut.dense_tokens) - 2
    assert view.cut_short and 0 < kept < n
    assert cut.dense_tokens == full.dense_tokens[: 2 + kept], "the kept tokens are the uninterrupted run's"
    assert len(view.tokens) == len(cut.prompt_ids) + len(cut.dense_tokens)


def test_a_cancel_before_the_first_token_is_a_cancel(model_dirs):
    session = _session(model_dirs)
    with pytest.raises(Cancelled):
        jobs.extend(8)(_Context({jobs.SESSION: session}, cancel_after=0))
