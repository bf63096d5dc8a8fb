"""RULER-format needles on the demo model (`make eval`): the dense cache does the single- and multi-key tasks, and
snapkv keeps the needle when the question is in its window (query-aware) far better than without it."""

from __future__ import annotations

import pytest

from kvcore.engine.session import Session
from kvcore.probes.ruler.run import RulerRun, prepare, sample_scores
from kvcore.probes.ruler.table import DENSE
from kvcore.resources import demo_model_dir

TASKS = ("niah_single", "niah_multikey")


def _mean(query_aware: bool, method: str) -> float:
    session = Session.load(str(demo_model_dir()))
    run = RulerRun(
        session.info.path, (method,), (0.75,), TASKS, length=1000, samples=6, query_aware=query_aware
    )
    scores = [sample_scores(session, run, item, [method])[method][0] for item in prepare(session, run)]
    return sum(scores) / len(scores)


@pytest.mark.eval
def test_the_dense_cache_does_the_needle_tasks():
    assert _mean(False, DENSE) >= 0.75


@pytest.mark.eval
def test_snapkv_loses_the_needle_without_the_question():
    aware, agnostic = _mean(True, "snapkv"), _mean(False, "snapkv")
    assert aware >= agnostic + 0.25, (aware, agnostic)
