"""RULER-format tasks (Hsieh et al., 2024), found by module: each file here defines one `TASK`.

`make_sample(tokenizer, task, haystack, length, seed)` writes a sample of about `length` tokens of context and
question (counted with the model's tokenizer); `kvcore.probes.ruler.run` scores methods on samples as kvpress's
leaderboard does. MLX-free, like the rest of kvcore.probes.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import Any

from kvcore.probes.generator import token_encoder
from kvcore.probes.ruler.base import HAYSTACKS, Parts, Sample, Task, seeded
from kvcore.probes.ruler.haystack import Haystack

__all__ = ["HAYSTACKS", "Sample", "Task", "make_sample", "tasks"]

#: Context tokens a task's haystack needs at the least around its needles and question.
MIN_BODY_TOKENS = 16
#: Tries at fitting a sample under its length.
FIT_ROUNDS = 4
_SKIP = {"base", "haystack", "niah", "words", "run", "table", "plot"}


@cache
def tasks() -> dict[str, Task]:
    """name -> Task for every module of this package that defines `TASK`, by name."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name not in _SKIP:
            task = importlib.import_module(f"{__name__}.{info.name}").TASK
            found[task.name] = task
    return found


def make_sample(tokenizer: Any, task: str, haystack: str, length: int, seed: int) -> Sample:
    """A sample of `task` in `haystack` of about `length` tokens (context and question); ValueError naming the
    allowed values or the shortest length that fits."""
    if task not in tasks():
        raise ValueError(f"unknown RULER task {task!r}; available: {', '.join(tasks())}")
    if haystack not in HAYSTACKS:
        raise ValueError(f"unknown haystack {haystack!r}; choose {' or '.join(HAYSTACKS)}")
    spec = tasks()[task]
    encode = token_encoder(tokenizer)
    target = length
    for _ in range(FIT_ROUNDS):  # line and word counts are estimates: aim lower until it fits the length
        hay = Haystack(haystack, tokenizer, encode, target, seeded(task, haystack, length, seed))
        parts = spec.build(hay)
        context = parts.head + (parts.body if parts.body is not None else _body(hay, parts, spec.name))
        sample = Sample(
            task=task,
            haystack=haystack,
            seed=seed,
            length=length,
            context=context,
            question=parts.question,
            answers=tuple(parts.answers),
            metric=spec.metric,
            max_new_tokens=hay.tokens(parts.answer_text) + (2 if haystack == "code" else 8),
            answer_prefix=parts.answer_prefix,
        )
        n_tokens = hay.tokens(context + sample.feed(None))
        if n_tokens <= length:
            return sample
        target = int(target * length / n_tokens) - 1
    raise ValueError(f"{task} did not fit {length} tokens in {haystack}: give a longer length")


def _body(hay: Haystack, parts: Parts, task: str) -> str:
    fixed = hay.tokens(parts.head + "".join(parts.needles) + parts.question + parts.answer_prefix)
    budget = hay.length - fixed
    if budget < MIN_BODY_TOKENS:
        raise ValueError(
            f"length {hay.length} is too short for {task}: its needles and question take {fixed} tokens; give at "
            f"least {fixed + MIN_BODY_TOKENS}"
        )
    return hay.hide(hay.units(budget), parts.needles)
