"""Score methods on RULER-format samples as kvpress's evaluation does, one table row per method.

Query-agnostic (kvpress's default): the context alone is prefilled and compressed, then the question (and the
answer prefix) is appended to a copy of the compressed cache and answered greedily. Query-aware: context and
question are prefilled and compressed together, so the question is in every observation window. One prefill per
sample serves every method and ratio; one compression per (sample, method, ratio).

Under `mlx.launch` the ranks score one sample each a round and the scores are gathered (kvcore.sets.ranks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvcore.defaults import DEFAULT_SCHEDULE
from kvcore.probes.ruler import make_sample
from kvcore.probes.ruler.base import Sample
from kvcore.probes.ruler.table import DENSE, row


@dataclass(frozen=True)
class RulerRun:
    """What `kvlens ruler` evaluates: methods × compression ratios on `samples` seeds of every task."""

    model: str
    methods: tuple[str, ...]
    ratios: tuple[float, ...]
    tasks: tuple[str, ...]
    haystack: str = "code"
    length: int = 4096
    samples: int = 20
    query_aware: bool = False
    schedule: str = DEFAULT_SCHEDULE
    chat_template: bool = True

    @property
    def mode(self) -> str:
        return "query-aware" if self.query_aware else "query-agnostic"

    def run_cells(self) -> dict[str, Any]:
        """The table's run columns (kvcore.probes.ruler.table.RUN_COLUMNS)."""
        return {
            "model": self.model,
            "mode": self.mode,
            "haystack": self.haystack,
            "length": self.length,
            "samples": self.samples,
            "schedule": self.schedule,
        }

    def configs(self, method: str) -> list[Any]:
        """One CompressionConfig per ratio (retention = 1 − compression ratio); ValueError for a bad one."""
        from kvcore.engine.session import CompressionConfig

        return [CompressionConfig(method, round(1 - r, 6), schedule=self.schedule) for r in self.ratios]


@dataclass(frozen=True)
class Prepared:
    """A sample as this model reads it: the context ids, and the text fed after the context."""

    sample: Sample
    context_ids: list[int]
    feed: str
    n_feed: int


def prepare(session: Any, run: RulerRun) -> list[Prepared]:
    """Every sample of the run (task-major, seeds 0 … samples − 1), tokenized as the model reads it; ValueError
    before any prefill when one does not fit the model's context with its answer."""
    from kvcore.model.prompting import split_chat

    ctx = session.info.max_context
    if ctx is not None and run.length >= ctx:
        raise ValueError(
            f"--length {run.length}: the model's context is {ctx} positions (max_position_embeddings), the "
            f"answer included: give a --length below {ctx}"
        )
    tok = session.tokenizer
    template = run.chat_template and session.has_chat_template
    out = []
    for task in run.tasks:
        for seed in range(run.samples):
            sample = make_sample(tok, task, run.haystack, run.length, seed)
            if template:
                head, tail = split_chat(tok, sample.context)
                ids, feed = list(tok.encode(head, add_special_tokens=False)), sample.feed(tail)
            else:
                ids, feed = list(tok.encode(sample.context)), sample.feed(None)
            item = Prepared(sample, ids, feed, len(tok.encode(feed, add_special_tokens=False)))
            _check_fits(item, session.info.max_context, run.length)
            out.append(item)
    return out


def _check_fits(item: Prepared, ctx: int | None, length: int) -> None:
    need = len(item.context_ids) + item.n_feed + item.sample.max_new_tokens
    if ctx is not None and need > ctx:
        s = item.sample
        raise ValueError(
            f"--length {length}: {s.task} (seed {s.seed}) needs {need} positions with its question and answer, "
            f"but the model's context is {ctx}: give --length {max(1, length - (need - ctx))} or less"
        )


def sample_scores(
    session: Any, run: RulerRun, item: Prepared, methods: Sequence[str]
) -> dict[str, list[float]]:
    """One prefill of the sample serves every method: method -> its score at every ratio, in run.ratios' order
    (the dense cache: the same score at each)."""
    s, n = item.sample, item.sample.max_new_tokens
    decode = session.tokenizer.decode
    out: dict[str, list[float]] = {}
    if run.query_aware:
        feed_ids = session.tokenizer.encode(item.feed, add_special_tokens=False)
        session.prefill([*item.context_ids, *feed_ids], n_tokens=n)
        for m in methods:
            if m == DENSE:
                out[m] = [s.score(decode(session.dense_tokens))] * len(run.ratios)
            else:
                out[m] = [
                    s.score(decode(session.continuation(session.compress(c), n))) for c in run.configs(m)
                ]
        return out
    session.prefill(item.context_ids, n_tokens=1)
    for m in methods:
        if m == DENSE:
            out[m] = [s.score(decode(session.answer_tokens(None, item.feed, n, run.schedule)))] * len(
                run.ratios
            )
        else:
            out[m] = [
                s.score(decode(session.answer_tokens(session.compress(c), item.feed, n, run.schedule)))
                for c in run.configs(m)
            ]
    return out


Scores = dict[int, dict[str, list[float]]]  # sample index -> method -> score per ratio


def score_rounds(
    session: Any,
    run: RulerRun,
    items: Sequence[Prepared],
    methods: Sequence[str],
    ranks: Any,
    scored: Scores,
    on_round: Callable[[Scores], None] | None = None,
) -> Scores:
    """Every sample not in `scored`, in rounds of one sample a rank; after each round every rank has every score
    and `on_round` (rank 0: write the checkpoint, draw progress) sees them all."""
    pending = [i for i in range(len(items)) if i not in scored]
    scored = dict(scored)
    for start in range(0, len(pending), ranks.size):
        share = pending[start : start + ranks.size]
        mine = {}
        if ranks.rank < len(share):
            i = share[ranks.rank]
            mine[i] = sample_scores(session, run, items[i], methods)
        for part in ranks.gather_json(mine):
            scored.update({int(k): v for k, v in part.items()})
        if on_round is not None:
            on_round(scored)
    return scored


def method_row(run: RulerRun, items: Sequence[Prepared], scored: Scores, method: str) -> dict[str, Any]:
    """The method's table row from every sample's scores."""
    table: dict[float, dict[str, list[float]]] = {r: {t: [] for t in run.tasks} for r in run.ratios}
    for i, item in enumerate(items):
        for r, score in zip(run.ratios, scored[i][method], strict=True):
            table[r][item.sample.task].append(score)
    return row(method, run.run_cells(), table, run.ratios, run.tasks)
