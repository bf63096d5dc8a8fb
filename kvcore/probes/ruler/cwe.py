"""Common-words extraction (RULER cwe): a list of words, ten of them frequent; name the ten."""

from __future__ import annotations

from kvcore.probes.ruler.base import Parts, Task
from kvcore.probes.ruler.haystack import Haystack
from kvcore.probes.ruler.words import word_pool

#: RULER's shape at 4k: ten common words, 30 times each; every other word 3 times.
N_COMMON, MAX_COMMON_FREQ, UNCOMMON_FREQ = 10, 30, 3
#: The smallest count of a common word that still stands out from the uncommon ones.
MIN_COMMON_FREQ = 5
#: Rounds of measuring the rendered list and refitting its length.
FIT_ROUNDS = 3
#: Entries of the shortest list: the common words at their least, and one uncommon word.
SHORTEST = 1.2 * (N_COMMON * MIN_COMMON_FREQ + UNCOMMON_FREQ)


def build(h: Haystack) -> Parts:
    rng = h.rng
    code = h.kind == "code"
    if code:
        head, question = (
            "WORDS = [\n",
            '\n# the 10 most common words in WORDS, most common first\nTOP_10 = ["',
        )
        prefix = ""
    else:
        head = (
            "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
            "ones that appear most often.\n"
        )
        question, prefix = (
            "\nQuestion: What are the 10 most common words in the above list?",
            " Answer: The top 10 words that appear most often in the list are:",
        )
    fixed = h.tokens(head + question + prefix)
    per = h.tokens(_render(["amber"] * 20, code)) / 20
    entries = int((h.length - fixed) / per)
    for _ in range(
        FIT_ROUNDS
    ):  # the list's tokens depend on its words: refit the count to the measured length
        freq = max(MIN_COMMON_FREQ, min(MAX_COMMON_FREQ, round(0.3 * entries / N_COMMON)))
        n_uncommon = (entries - N_COMMON * freq) // UNCOMMON_FREQ
        if n_uncommon < 1:
            raise ValueError(
                f"length {h.length} is too short for cwe; give at least {int(fixed + per * SHORTEST)}"
            )
        pool = word_pool(rng, N_COMMON + n_uncommon)
        listed = [w for w in pool[:N_COMMON] for _ in range(freq)]
        listed += [w for w in pool[N_COMMON:] for _ in range(UNCOMMON_FREQ)]
        rng.shuffle(listed)
        entries = int(entries * (h.length - fixed) / h.tokens(_render(listed, code)))
    answers = pool[:N_COMMON]
    text = '", "'.join(answers) + '"]' if code else ", ".join(answers)
    return Parts(head, (), question, answers, text, prefix, body=_render(listed, code))


def _render(words: list[str], code: bool) -> str:
    if code:
        return "".join(f'    "{w}",\n' for w in words) + "]\n"
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


TASK = Task("cwe", "all", build, "common-words extraction: the ten words a long list repeats most")
