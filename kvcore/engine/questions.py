"""Compress once, ask many: questions answered from one compressed context (query-agnostic, kvpress's protocol).

The context alone is prefilled and compressed; each question is then appended to a copy of the compressed cache and
answered greedily, and the dense reference does the same on a copy of the dense cache, so one prefill and one
compression serve every question and no question ever sees another. Correct means the expected answer appears in
the answer text (RULER's string match). KL and top-1 agreement are teacher-forced on the dense answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Question:
    """A question about the context, with the answer it expects (None: only compared with the dense answer)."""

    text: str
    answer: str | None = None


@dataclass
class Answer:
    """One question answered from the dense and from the compressed cache."""

    question: Question
    dense_text: str
    compressed_text: str
    dense_tokens: list[int] = field(repr=False)
    compressed_tokens: list[int] = field(repr=False)
    metrics: dict[str, Any] = field(repr=False)  # teacher-forced on the dense answer: kl_mean, agreement, …

    @property
    def dense_correct(self) -> bool | None:
        return None if self.question.answer is None else self.question.answer in self.dense_text

    @property
    def compressed_correct(self) -> bool | None:
        return None if self.question.answer is None else self.question.answer in self.compressed_text

    def row(self) -> dict[str, Any]:
        """The question's row for `--json` and CSVs."""
        return {
            "question": self.question.text,
            "answer": self.question.answer,
            "dense": self.dense_text,
            "compressed": self.compressed_text,
            "dense_correct": self.dense_correct,
            "compressed_correct": self.compressed_correct,
            "kl_mean": self.metrics["kl_mean"],
            "agreement": self.metrics["agreement"],
        }


def accuracy(answers: list[Answer], compressed: bool) -> float | None:
    """Share of the questions with an expected answer that were answered correctly (None when none has one)."""
    scored = [a.compressed_correct if compressed else a.dense_correct for a in answers]
    scored = [s for s in scored if s is not None]
    return sum(scored) / len(scored) if scored else None


def answer_query_aware(
    session: Any, context_ids: list[int], question: Question, config: Any, n: int, suffix: str = ""
) -> Answer:
    """Query-aware (KV Lens's default, SnapKV's papers): context and question prefilled and compressed together, so
    the question sits in every observation window. One prefill a question; the session then holds that prompt.
    `suffix` follows the question (the chat template's end of the user message)."""
    ids = [*context_ids, *session.tokenizer.encode(question.text + suffix, add_special_tokens=False)]
    session.prefill(ids, n)
    state = session.compress(config)
    regen = session.regenerate(state, n)
    decode = session.tokenizer.decode
    dense = list(session.dense_tokens[:n])
    return Answer(question, decode(dense), decode(regen.tokens), dense, list(regen.tokens), regen.metrics)
