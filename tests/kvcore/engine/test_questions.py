"""Compress once, ask many: questions answered from one compressed context, as kvpress evaluates (query-agnostic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcore.engine.questions import Question, accuracy
from kvcore.engine.session import CompressionConfig, Session
from kvcore.resources import demo_model_dir

ROOT = Path(__file__).resolve().parents[3]
LOOKUP = 'assert ROUTES["cache_ibis_hash"] == "'
OTHER = 'assert ROUTES["'


@pytest.fixture(scope="module")
def context() -> tuple[Session, list[int]]:
    """The demo model prefilled with dict_lookup less its question line (the context alone)."""
    session = Session.load(str(demo_model_dir()))
    text = (ROOT / "resources" / "prompts" / "dict_lookup.txt").read_text()
    ids = session.tokenizer.encode(text[: text.rindex(LOOKUP)])
    session.prefill(ids, 4)
    return session, ids


@pytest.mark.parametrize("schedule", ["paper", "mlx-lm"])
def test_every_question_sees_the_same_compressed_cache(context, schedule):
    session, ids = context
    config = CompressionConfig("snapkv", 0.5, schedule=schedule)
    state = session.compress(config)
    kept, offsets = state.kept.copy(), [c.offset for c in state.cache]
    first = [session.answer(state, Question(q), 6) for q in (OTHER, LOOKUP)]
    assert [c.offset for c in state.cache] == offsets and (state.kept == kept).all()  # nothing appended to it
    fresh = session.answer(session.compress(config), Question(LOOKUP), 6)  # asked first, of a fresh copy
    assert (
        fresh.compressed_tokens == first[1].compressed_tokens and fresh.dense_tokens == first[1].dense_tokens
    )
    # The question is never in what the method scored: only the context's positions are ranked and kept.
    n_context = len(ids) - (schedule == "mlx-lm")
    assert state.kept.shape[2] == n_context
    assert all(r.scores.shape[1] == n_context for r in session.ranking(config).layers if r is not None)


def test_the_dense_answer_is_a_plain_prefill_of_context_and_question(context):
    session, ids = context
    answer = session.answer(session.compress(CompressionConfig("snapkv", 0.25)), Question(LOOKUP, "fzi"), 6)
    plain = Session.load(str(demo_model_dir()))
    plain.prefill([*ids, *session.tokenizer.encode(LOOKUP, add_special_tokens=False)], 6)
    assert answer.dense_tokens == plain.dense_tokens
    assert answer.dense_correct  # the dense cache finds the value: `fzi"`


def test_accuracy_counts_only_questions_with_an_answer(context):
    session, _ = context
    state = session.compress(CompressionConfig("full", 1.0))
    answers = [session.answer(state, q, 4) for q in (Question(LOOKUP, "fzi"), Question(OTHER))]
    assert accuracy(answers, compressed=True) == accuracy(answers, compressed=False) == 1.0
    assert (
        answers[1].row()["compressed_correct"] is None
        and answers[0].compressed_tokens == answers[0].dense_tokens
    )


def test_an_empty_question_is_refused(context):
    session, _ = context
    with pytest.raises(ValueError, match="question '' is empty"):
        session.answer(session.compress(CompressionConfig("snapkv", 0.5)), Question(""), 4)
