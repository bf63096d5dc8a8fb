"""The Questions panel's jobs: answer questions about the prefilled context at one compression setting, and the
dense attention of one question over the context (kvcore.engine.questions, kvcore.engine.question_attention).

Query-agnostic (kvpress's protocol): the main session's prefill is the context, compressed once per setting; each
question is appended to copies of the compressed and the dense cache (Session.answer). Query-aware: context and
question are prefilled together, once per question, on sessions of their own that share the loaded model and are
kept while the context and questions stay the same, so a slider move is one compression a question there too; the
main session's prefill is never replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.engine.jobs import SESSION
from app.engine.thread import Job, JobContext
from app.engine.view_model import rows_of
from kvcore.capture.prefill import Cancelled
from kvcore.engine.question_attention import question_attention, top_positions
from kvcore.engine.questions import Answer, Question, accuracy
from kvcore.engine.session import CompressionConfig, Session

#: The kinds of job: answering (coalesced, as a recompress) and one question's attention.
QUESTIONS, QUESTION_ATTENTION = "questions", "question_attention"
#: ctx.state key: {(context ids, question text, tokens): Session prefilled with context + question}.
AWARE_SESSIONS = "query_aware_sessions"


def _session(ctx: JobContext) -> Session:
    session = ctx.state.get(SESSION)
    if session is None:
        raise ValueError("no model is loaded: load a model first")
    return session


@dataclass
class QuestionsView:
    """Every question answered at one setting, ready for the panel."""

    config: dict[str, Any]
    query_aware: bool
    answers: list[Answer]
    accuracy_dense: float | None
    accuracy_compressed: float | None
    prompt_tokens: int
    request_id: int = 0


@dataclass
class AttentionView:
    """Where one question looks: [L*H_kv, T_context] attention rows and the top positions of each row."""

    question: str
    attention: np.ndarray = field(repr=False)
    marked: np.ndarray = field(repr=False)


def answer_questions(
    config: dict[str, Any],
    questions: list[Question],
    query_aware: bool,
    n_tokens: int,
    is_current: Callable[[int], bool] | None = None,
) -> Job:
    """Answer every question from the dense and the compressed cache at `config`; None when nothing is prefilled
    or a newer request made this one stale (a slider drag never waits for answers nobody will see)."""

    def job(ctx: JobContext) -> QuestionsView | None:
        cfg = CompressionConfig.from_dict(config)
        main = _session(ctx)
        if not main.prompt_ids:
            return None

        def stale() -> bool:
            return is_current is not None and not is_current(ctx.request_id)

        def stop() -> bool:
            return ctx.cancelled() or stale()

        state = None if query_aware else main.compress(cfg)
        answers = []
        for i, question in enumerate(questions):
            ctx.progress(i / len(questions), f"Answering question {i + 1} of {len(questions)}")
            try:
                if stop():
                    raise Cancelled(f"answering cancelled after {i} of {len(questions)} questions")
                if query_aware:
                    answers.append(_aware_answer(main, question, cfg, n_tokens, ctx.state, stop))
                else:
                    answers.append(main.answer(state, question, n_tokens, should_cancel=stop))
            except Cancelled:
                if stale() and not ctx.cancelled():
                    return None  # a newer setting replaces this one: nobody waits for its answers
                raise
        view = QuestionsView(
            cfg.to_dict(),
            query_aware,
            answers,
            accuracy(answers, compressed=False),
            accuracy(answers, compressed=True),
            len(main.prompt_ids),
        )
        view.request_id = ctx.request_id
        return view

    return job


def _aware_answer(
    main: Session,
    question: Question,
    cfg: CompressionConfig,
    n: int,
    engine_state: dict,
    should_cancel: Callable[[], bool],
) -> Answer:
    """Context and question compressed together (kvcore.engine.questions.answer_query_aware), the prefill of each
    (context, question) kept in `engine_state`: only the first setting pays for it."""
    sessions: dict = engine_state.setdefault(AWARE_SESSIONS, {})
    key = (tuple(main.prompt_ids), question.text, n, id(main.model))
    session = sessions.get(key)
    if session is None:
        for old in [k for k in sessions if k[0] != key[0] or k[3] != key[3]]:
            del sessions[old]  # another context or model: those prefills are of no more use
        session = Session(main.model, main.tokenizer, main.info)
        ids = main.tokenizer.encode(question.text, add_special_tokens=False)
        if not ids:
            raise ValueError(f"question {question.text!r} is empty: give it some text")
        session.prefill([*main.prompt_ids, *ids], n, should_cancel=should_cancel)
        sessions[key] = session
    state = session.compress(cfg)
    regen = session.regenerate(state, n, should_cancel=should_cancel)
    decode = session.tokenizer.decode
    dense = list(session.dense_tokens[:n])
    return Answer(question, decode(dense), decode(regen.tokens), dense, list(regen.tokens), regen.metrics)


def attention_of(question: str, top: int) -> Job:
    """The dense attention of `question`'s tokens over the prefilled context, with each row's `top` positions."""

    def job(ctx: JobContext) -> AttentionView:
        main = _session(ctx)
        if not main.prompt_ids:
            raise ValueError("no prompt has been prefilled yet: run Prefill first")
        ids = main.tokenizer.encode(question, add_special_tokens=False)
        ctx.progress(0.0, "Attention of the question over the context")
        attention = question_attention(main.model, main.prompt_ids, ids)
        return AttentionView(question, rows_of(attention), rows_of(top_positions(attention, top)))

    return job
