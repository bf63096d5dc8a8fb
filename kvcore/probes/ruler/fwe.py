"""Frequent-words extraction (RULER fwe): coded words drawn with Zipf frequencies; name the three most frequent.

Counts are Zipf's (alpha 2) exactly rather than sampled, so the three answers are always strictly the most frequent;
the most frequent token of all is RULER's '....', which the question says to ignore.
"""

from __future__ import annotations

import math
import random
import string

from kvcore.probes.ruler.base import Parts, Task
from kvcore.probes.ruler.haystack import Haystack
from kvcore.probes.ruler.words import distinct

ALPHA, N_ANSWERS, DOTS = 2.0, 3, "...."
#: Words a line of the code form holds.
_PER_LINE = 16
#: Rounds of measuring the rendered text and refitting its length.
FIT_ROUNDS = 3


def build(h: Haystack) -> Parts:
    rng = h.rng
    code = h.kind == "code"
    if code:
        head = 'CODED = """\n'
        question = '\n# the three most frequent coded words in CODED (ignore the dots)\nTOP_3 = ["'
        prefix = ""
    else:
        head = (
            "Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words. "
        )
        question = (
            "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most "
            "frequently appeared words in the above coded text?"
        )
        prefix = " Answer: According to the coded text above, the three most frequently appeared words are:"
    fixed = h.tokens(head + question + prefix)
    words = int((h.length - fixed) / (h.tokens(_render(["qzx"] * 32, code)) / 32))
    for _ in range(
        FIT_ROUNDS
    ):  # the text's tokens depend on its words: refit the count to the measured length
        top = int(words / sum(k**-ALPHA for k in range(1, int(math.sqrt(words)) + 2)))
        counts = [int(top * k**-ALPHA) for k in range(1, int(math.sqrt(top)) + 1)]
        if len(counts) <= N_ANSWERS + 1 or counts[N_ANSWERS] <= counts[N_ANSWERS + 1]:
            raise ValueError(f"length {h.length} is too short for fwe: its three answers would not stand out")
        coded = distinct(rng, _coded_word, len(counts) - 1)
        vocab = [DOTS, *coded]
        listed = [w for w, c in zip(vocab, counts, strict=True) for _ in range(c)]
        rng.shuffle(listed)
        words = int(words * (h.length - fixed) / h.tokens(_render(listed, code)))
    answers = vocab[1 : N_ANSWERS + 1]
    text = '", "'.join(answers) + '"]' if code else ", ".join(answers)
    return Parts(head, (), question, answers, text, prefix, body=_render(listed, code))


def _coded_word(rng: random.Random) -> str:
    """RULER's coded word: three random lower-case letters."""
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(3))


def _render(words: list[str], code: bool) -> str:
    if not code:
        return " ".join(words)
    lines = [" ".join(words[i : i + _PER_LINE]) for i in range(0, len(words), _PER_LINE)]
    return "\n".join(lines) + '\n"""\n'


TASK = Task(
    "fwe",
    "all",
    build,
    "frequent-words extraction: the three coded words a Zipf-distributed text repeats most",
)
