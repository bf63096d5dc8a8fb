"""A question file: JSONL lines of {"question": …, "answer": …} (answer optional), asked of one context."""

from __future__ import annotations

from pathlib import Path

from kvcore.engine.questions import Question
from kvcore.sets.prompt_sets import MAX_PROMPT_BYTES, PromptSetError, json_record, read_capped, text_field

_EXAMPLE = 'write {"question": "…", "answer": "…"} (answer optional)'


def load_questions(path: Path) -> list[Question]:
    """Every question of `path`, in order; PromptSetError naming the file (and line) when it is not one."""
    try:
        lines = read_capped(path, "--questions", MAX_PROMPT_BYTES).decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise PromptSetError(f"{path}: not UTF-8 text; save it as UTF-8") from None
    questions = []
    for n, line in enumerate(lines, start=1):
        if line.strip():
            obj = json_record(line, f"{path}:{n}", _EXAMPLE, ("question", "answer"), ("question",))
            question = text_field(obj, "question", f"{path}:{n}", _EXAMPLE)
            questions.append(Question(question, text_field(obj, "answer", f"{path}:{n}", _EXAMPLE, False)))
    if not questions:
        raise PromptSetError(f"{path}: no questions; {_EXAMPLE}, one a line")
    return questions
