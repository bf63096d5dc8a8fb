"""Code to bury needles in: whole lines of held-out standard-library files, counted in the model's tokens."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from kvcore.resources import resources_dir

Encode = Callable[[str], Sequence[int]]


def filler_dir() -> Path:
    return resources_dir() / "probes" / "filler"


@lru_cache(maxsize=1)
def filler_lines() -> tuple[str, ...]:
    """Every line (with its newline) of the bundled filler files, in name order; blank runs kept as they are."""
    lines: list[str] = []
    for path in sorted(filler_dir().glob("*.py")):
        lines.extend(path.read_text(encoding="utf-8").splitlines(keepends=True))
    if not lines:
        raise FileNotFoundError(f"no probe filler in {filler_dir()}: the resources folder is incomplete")
    return tuple(lines)


def line_token_counts(lines: Sequence[str], encode: Encode) -> list[int]:
    """Tokens of each line encoded alone: close to its share of the whole, since lines end in a newline."""
    return [len(encode(line)) for line in lines]


def take_lines(lines: Sequence[str], counts: Sequence[int], rng: random.Random, n_tokens: int) -> list[str]:
    """Consecutive lines from a random start (wrapping) until about `n_tokens` tokens."""
    out: list[str] = []
    i, total = rng.randrange(len(lines)), 0
    while total < n_tokens:
        out.append(lines[i])
        total += counts[i]
        i = (i + 1) % len(lines)
    return out
