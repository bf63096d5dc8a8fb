"""Keys, values and words for RULER tasks: distinct, seeded, short in tokens."""

from __future__ import annotations

import random
import string
from collections.abc import Callable

from kvcore.probes.names import PREFIXES, WORDS, make_name, make_value


def distinct(rng: random.Random, make: Callable[[random.Random], str], n: int) -> list[str]:
    """n different values of `make(rng)`."""
    out: list[str] = []
    while len(out) < n:
        value = make(rng)
        if value not in out:
            out.append(value)
    return out


def key_word(rng: random.Random) -> str:
    """A RULER-like key: two words joined by a hyphen (RULER: an adjective and a noun)."""
    return f"{rng.choice(WORDS)}-{rng.choice(WORDS)}"


def magic_number(rng: random.Random) -> str:
    """RULER's value: a 7-digit number."""
    return str(rng.randint(1_000_000, 9_999_999))


def code_value(rng: random.Random) -> str:
    """A code needle's value: 3–4 random characters (kvcore.probes.names), no word a first token completes."""
    return make_value(rng, "alnum")


def code_name(rng: random.Random) -> str:
    return make_name(rng, "snake")


def upper_name(rng: random.Random) -> str:
    return make_name(rng, "upper")


def variable(rng: random.Random) -> str:
    """RULER's variable-tracking name: five capital letters."""
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(5))


def word_pool(rng: random.Random, n: int) -> list[str]:
    """n distinct lower-case words: the probe vocabulary, then pairs of it joined, shuffled."""
    base = sorted(set(WORDS) | set(PREFIXES))
    pool = list(base)
    while len(pool) < n:
        word = rng.choice(base) + rng.choice(base)
        if word not in pool:
            pool.append(word)
    rng.shuffle(pool)
    return pool[:n]
