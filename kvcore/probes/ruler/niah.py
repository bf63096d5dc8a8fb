"""The four needle-in-a-haystack variants of RULER in one builder: keys, values per key, keys asked.

Noise haystack: RULER's own sentences ("One of the special magic numbers for {key} is: {value}."). Code haystack:
one binding and ask form per variant; the single-key forms are the probe families (kvcore.probes.families).
"""

from __future__ import annotations

from kvcore.probes.families import FAMILIES
from kvcore.probes.generator import make_probe
from kvcore.probes.ruler.base import Parts
from kvcore.probes.ruler.haystack import Haystack
from kvcore.probes.ruler.words import code_name, code_value, distinct, key_word, magic_number

#: RULER's count of needles in the multi-key, multi-value and multi-query variants.
N_NEEDLES = 4
_HEAD = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you "
    "about the numbers afterwards.\n"
)


def build(h: Haystack, n_keys: int = 1, n_values: int = 1, n_queries: int = 1) -> Parts:
    """A needle task: `n_keys` keys, `n_values` values for the first, the first `n_queries` keys asked."""
    if h.kind == "code":
        return _code(h, n_keys, n_values, n_queries)
    rng = h.rng
    keys = distinct(rng, key_word, n_keys)
    values = distinct(rng, magic_number, n_keys - 1 + n_values)
    pairs = [(keys[0], v) for v in values[:n_values]] + list(zip(keys[1:], values[n_values:], strict=True))
    rng.shuffle(pairs)
    needles = [f"One of the special magic numbers for {k} is: {v}. " for k, v in pairs]
    asked = keys[:n_queries]
    query = asked[0] if n_queries == 1 else ", ".join(asked[:-1]) + ", and " + asked[-1]
    answers = values[:n_values] if n_queries == 1 else [dict(pairs)[k] for k in asked]
    return Parts(
        head=_HEAD,
        needles=needles,
        question=f"\nWhat are all the special magic numbers for {query} mentioned in the provided text?",
        answers=answers,
        answer_text=", ".join(answers) + ".",
        answer_prefix=f" The special magic numbers for {query} mentioned in the provided text are",
    )


def _code(h: Haystack, n_keys: int, n_values: int, n_queries: int) -> Parts:
    rng = h.rng
    if n_values == 1 and n_queries == 1:  # the probe families: one key asked, the others distractors
        families = sorted(n for n, f in FAMILIES.items() if f.values != "word")
        family = rng.choice(families)
        seed, depth = rng.randrange(1 << 30), rng.uniform(0.05, 0.95)
        probe = make_probe(h.tokenizer, seed, depth, h.length, family, n_distractors=n_keys - 1)
        question = FAMILIES[family].question(probe.name)
        return Parts("", (), question, (probe.answer,), probe.answer, body=probe.prompt[: -len(question)])
    names = distinct(rng, code_name, n_keys)
    values = distinct(rng, code_value, n_keys - 1 + n_values)
    if n_values > 1:  # one list, appended to in order
        needles = [f'{names[0]}.append("{v}")\n' for v in values[:n_values]]
        answers = values[:n_values]
        question = f'\n# every value appended to {names[0]} above, in order\nassert {names[0]} == ["'
        return Parts("", needles, question, answers, '", "'.join(answers) + '"]')
    pairs = list(zip(names, values, strict=True))
    rng.shuffle(pairs)
    needles = [f'{n} = "{v}"\n' for n, v in pairs]
    asked = names[:n_queries]
    answers = [dict(pairs)[n] for n in asked]
    question = f'\n# the values configured above\nassert ({", ".join(asked)}) == ("'
    return Parts("", needles, question, answers, '", "'.join(answers) + '")')
