"""Scoring RULER-format samples on a compressed cache: query-agnostic (context compressed alone, the question fed
after it) and query-aware, on a tiny real model."""

from __future__ import annotations

import dataclasses

import pytest

from kvcore.engine.session import Session
from kvcore.probes.ruler.run import RulerRun, prepare, sample_scores
from kvcore.probes.ruler.table import DENSE


@pytest.fixture(scope="module")
def session(model_dirs) -> Session:
    return Session.load(str(model_dirs["llama"]))


def _run(session: Session, query_aware: bool) -> RulerRun:
    return RulerRun(
        session.info.path,
        (DENSE, "full", "streaming_llm"),
        (0.25, 0.875),
        ("niah_single",),
        length=300,
        samples=1,
        query_aware=query_aware,
    )


@pytest.mark.parametrize("query_aware", [False, True])
def test_the_uncompressed_cache_scores_as_dense_and_the_question_is_never_compressed_unless_asked(
    session, query_aware
):
    run = _run(session, query_aware)
    (item,) = prepare(session, run)
    n = item.sample.max_new_tokens
    session.prefill(item.context_ids, n_tokens=1)
    dense_text = session.tokenizer.decode(session.answer_tokens(None, item.feed, n, run.schedule))
    if query_aware:
        ids = [*item.context_ids, *session.tokenizer.encode(item.feed, add_special_tokens=False)]
        session.prefill(ids, n_tokens=n)
        dense_text = session.tokenizer.decode(session.dense_tokens)
    # The model's own dense answer as the reference: dense and full score 1 at every ratio.
    item = dataclasses.replace(item, sample=dataclasses.replace(item.sample, answers=(dense_text,)))
    scores = sample_scores(session, run, item, [DENSE, "full", "streaming_llm"])  # one prefill serves all
    assert scores[DENSE] == scores["full"] == [1.0, 1.0] and len(scores["streaming_llm"]) == 2
    n_prefilled = len(item.context_ids) + (item.n_feed if query_aware else 0)
    assert (
        len(session.prompt_ids) == n_prefilled
    )  # query-agnostic: only the context was scored and compressed


def test_a_length_beyond_the_models_context_is_refused_before_any_prefill(session):
    run = dataclasses.replace(_run(session, False), length=session.info.max_context + 10)
    calls = session.forward_calls
    with pytest.raises(
        ValueError,
        match=r"--length \d+: the model's context is \d+ .*give a --length below",
    ):
        prepare(session, run)
    assert session.forward_calls == calls
