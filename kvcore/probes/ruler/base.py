"""What a RULER-format task is: a seeded sample of context, question and reference answers at a token length.

RULER (Hsieh et al., 2024) scores a model by string match: a sample scores the fraction of its references found in
the output (`all`), or 1 if any is (`part`); the references are matched case-insensitively. kvpress's evaluation
prefills and compresses the context, then appends the question and the answer prefix (query-agnostic).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvcore.probes.ruler.haystack import Haystack

#: RULER's two metrics: the share of the references in the output, or whether any is.
METRICS: tuple[str, ...] = ("all", "part")
#: The haystacks: code (the demo model's world) and RULER's repeated-sentence noise (for instruct models).
HAYSTACKS: tuple[str, ...] = ("code", "noise")


def string_match_all(output: str, references: Sequence[str]) -> float:
    """RULER's string_match_all for one sample: the fraction of references the output contains."""
    text = output.lower()
    return sum(r.lower() in text for r in references) / len(references)


def string_match_part(output: str, references: Sequence[str]) -> float:
    """RULER's string_match_part for one sample: 1 when the output contains any reference."""
    text = output.lower()
    return float(any(r.lower() in text for r in references))


@dataclass(frozen=True)
class Sample:
    """One generated task: the context to compress, the question asked after it, and what counts as the answer."""

    task: str
    haystack: str
    seed: int
    length: int
    context: str
    question: str
    answers: tuple[str, ...]
    metric: str
    max_new_tokens: int
    answer_prefix: str = ""

    def feed(self, tail: str | None) -> str:
        """The text appended to the context: question, the chat template's tail (None: no template; then a
        newline before an answer prefix, as kvpress's pipeline writes it) and the answer prefix."""
        if tail is None:
            tail = "\n" if self.answer_prefix else ""
        return self.question + tail + self.answer_prefix

    def score(self, output: str) -> float:
        """This sample's score in [0, 1] under its task's metric."""
        match = string_match_all if self.metric == "all" else string_match_part
        return match(output, self.answers)


@dataclass(frozen=True)
class Parts:
    """What a task writes: the context's head, the lines hidden in the haystack (in order), the question, the
    answer prefix, the references, and how the answer is spelt (its token count bounds the generation)."""

    head: str
    needles: Sequence[str]
    question: str
    answers: Sequence[str]
    answer_text: str
    answer_prefix: str = ""
    body: str | None = None  # a task that is its own haystack (cwe, fwe) writes the body itself


@dataclass(frozen=True)
class Task:
    """One RULER task type: its name, metric and a builder of Parts from a haystack (one file each)."""

    name: str
    metric: str
    build: Callable[[Haystack], Parts]
    description: str


def seeded(task: str, haystack: str, length: int, seed: int) -> random.Random:
    """The generator of one sample: the same (task, haystack, length, seed) always gives the same sample."""
    return random.Random(f"kvlens-ruler:{task}:{haystack}:{length}:{seed}")
