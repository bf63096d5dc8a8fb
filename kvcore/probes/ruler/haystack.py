"""The text needles hide in, measured in the model's tokens: code lines or RULER's repeated noise sentences."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvcore.probes.filler import Encode, filler_lines, line_token_counts

#: RULER's noise haystack (its `noise` type): these five sentences repeated.
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
_line_counts: dict[int, list[int]] = {}


@dataclass
class Haystack:
    """A haystack kind bound to a tokenizer, a target length and a seeded generator."""

    kind: str
    tokenizer: Any
    encode: Encode
    length: int
    rng: random.Random

    def tokens(self, text: str) -> int:
        return len(self.encode(text))

    def units(self, n_tokens: int) -> list[str]:
        """About `n_tokens` tokens of haystack as units needles may go between (code lines, noise blocks)."""
        if self.kind == "noise":
            per = self.tokens(NOISE + " ")
            return [NOISE + " " for _ in range(max(1, round(n_tokens / per)))]
        lines = filler_lines()
        key = id(self.tokenizer)
        if key not in _line_counts:
            _line_counts[key] = line_token_counts(lines, self.encode)
        counts, out = _line_counts[key], []
        i, total = self.rng.randrange(len(lines)), 0
        while total < n_tokens:
            out.append(lines[i])
            total += counts[i]
            i = (i + 1) % len(lines)
        return out

    def hide(self, units: list[str], needles: Sequence[str]) -> str:
        """The units with each needle at a random depth, the needles in their given order."""
        spots = sorted(self.rng.randrange(len(units) + 1) for _ in needles)
        out = list(units)
        for spot, _, needle in sorted(zip(spots, range(len(needles)), needles, strict=True), reverse=True):
            out.insert(spot, needle)  # last first, so needles at one spot keep their order
        return "".join(out)
