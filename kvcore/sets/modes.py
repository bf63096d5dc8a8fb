"""What differs between `sweep` and `probe` over a prompt set: the columns, the configurations' cells and the work
on one prompt (one prefill, then each configuration it still needs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvcore.defaults import DEFAULT_SCHEDULE, UNQUANTIZED_BITS
from kvcore.measure.export import CONFIG_COLUMNS, PROMPT_SWEEP_COLUMNS
from kvcore.sets.prompt_sets import PromptItem

#: A mode's work on one prompt: (session, prompt, configuration indices) -> (index, row dicts) per configuration.
PromptWork = Callable[[Any, PromptItem, tuple[int, ...]], Iterator[tuple[int, list[dict[str, Any]]]]]


@dataclass(frozen=True)
class Mode:
    """The columns of the results file, the CONFIG_COLUMNS cells of each configuration index (as its rows carry
    them), the work on one prompt, and whether every prompt needs an answer."""

    columns: tuple[str, ...]
    cells: list[dict[str, Any]]
    evaluate_prompt: PromptWork
    needs_answers: bool
    #: Whether it scores a context/questions set (kvcore.sets.prompt_sets): probe does, by recall.
    takes_questions: bool = False


def sweep_mode(
    configs: Sequence[Any], tokens: int, chat_template: bool = True, system_prompt: str | None = None
) -> Mode:
    """Each configuration's (layer, kv-head) rows with the summary metrics over `tokens` generated tokens, and
    recall against the prompt's `answer` where it has one."""
    from kvcore.engine.sweep import run_sweep
    from kvcore.probes.base import writes_answer

    def evaluate_prompt(
        session: Any, item: PromptItem, todo: tuple[int, ...]
    ) -> Iterator[tuple[int, list[dict]]]:
        session.prefill(item.text, tokens, chat_template=chat_template, system_prompt=system_prompt)
        for i, point in zip(todo, run_sweep(session, [configs[i] for i in todo]), strict=True):
            text = session.tokenizer.decode(list(point.tokens))
            recalled = None if item.answer is None else writes_answer(item.answer, text)
            yield i, [{**row, "prompt": item.id, "recalled": recalled} for row in point.csv_rows()]

    cells = [_config_cells(c, c.group_size if c.quantized else "") for c in configs]
    return Mode(PROMPT_SWEEP_COLUMNS, cells, evaluate_prompt, needs_answers=False)


def probe_mode(
    configs: Sequence[Any],
    chat_template: bool = True,
    system_prompt: str | None = None,
    query_aware: bool = False,
) -> Mode:
    """The dense cache's row (index 0) and one row per configuration, recall scored on `answer`. An item with a
    question (a context/questions set) is asked query-agnostic: the context alone prefilled (once for its
    questions in a row) and compressed, the question appended; `query_aware` prefills context and question."""
    from kvcore.probes.base import Probe
    from kvcore.probes.scoring import DENSE, PROMPT_PROBE_COLUMNS, config_rows, dense_row, question_rows

    def evaluate_prompt(
        session: Any, item: PromptItem, todo: tuple[int, ...]
    ) -> Iterator[tuple[int, list[dict]]]:
        text = item.text if item.question is None or not query_aware else item.text + item.question
        probe = Probe(text, item.answer or "", name="", family="", seed=None, depth=None, n_tokens=None)
        if item.question is not None and not query_aware:
            ids, feed = _context(session, item, chat_template, system_prompt)
            if session.prompt_ids != ids:  # the questions of one context in a row share its prefill
                session.prefill(ids, n_tokens=1)
            for i in todo:
                cfg = None if i == 0 else configs[i - 1]
                schedule = configs[0].schedule if configs else DEFAULT_SCHEDULE
                yield (
                    i,
                    [
                        {**row, "prompt": item.id}
                        for row in question_rows(session, probe, feed, [cfg], schedule)
                    ],
                )
            return
        session.prefill(text, probe.max_new_tokens, chat_template=chat_template, system_prompt=system_prompt)
        for i in todo:
            rows = [dense_row(session, probe)] if i == 0 else config_rows(session, probe, [configs[i - 1]])
            yield i, [{**row, "prompt": item.id} for row in rows]

    cells = [_cells(DENSE, "", 1.0, UNQUANTIZED_BITS, UNQUANTIZED_BITS, 0, "")]
    cells += [_config_cells(c, c.group_size) for c in configs]
    return Mode(PROMPT_PROBE_COLUMNS, cells, evaluate_prompt, needs_answers=True, takes_questions=True)


def _context(
    session: Any, item: PromptItem, chat_template: bool, system_prompt: str | None
) -> tuple[list[int], str]:
    """The context's ids and the text each question feeds after it: under a chat template, context and question
    are one user message (kvcore.model.prompting.split_chat)."""
    from kvcore.model.prompting import split_chat

    tok = session.tokenizer
    if chat_template and session.has_chat_template:
        head, tail = split_chat(tok, item.text, system_prompt)
        return list(tok.encode(head, add_special_tokens=False)), f"{item.question}{tail}"
    return session.encode(item.text, chat_template=False), str(item.question)


def _config_cells(c: Any, group_size: int | str) -> dict[str, Any]:
    return _cells(c.method, c.schedule, c.ratio, *c.widths, c.fp_recent, group_size)


def _cells(
    method: str,
    schedule: str,
    ratio: float,
    key_bits: int,
    value_bits: int,
    fp_recent: int,
    group_size: int | str,
) -> dict[str, Any]:
    values = (method, schedule, ratio, key_bits, value_bits, fp_recent, group_size)
    return dict(zip(CONFIG_COLUMNS, values, strict=True))
