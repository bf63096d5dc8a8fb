"""Build a needle probe: seeded, at a chosen depth and length, in one template family.

The needle (and its distractors, bound the same way to other names) is placed at a paragraph break of held-out
code so the prompt still reads as code; the question comes last and ends where the value must be written.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from kvcore.probes.base import Probe
from kvcore.probes.families import FAMILIES
from kvcore.probes.filler import Encode, filler_lines, line_token_counts, take_lines
from kvcore.probes.names import make_name, make_value

#: A value must be 1–3 tokens: what query-aware eviction can keep whole (DESIGN.md, calibration run).
VALUE_TOKENS = (1, 3)
#: How far (share of the body's tokens) a binding may move to sit at a paragraph break; beyond it, it goes at the
#: exact line: a fixed line count (40 once) moved needles by up to 0.8 of a 600-token prompt inside long functions.
SNAP_SHARE = 0.03
_counts_cache: dict[int, list[int]] = {}


def token_encoder(tokenizer: Any) -> Encode:
    """`encode(text) -> ids` for an mlx-lm / transformers tokenizer or a `tokenizers.Tokenizer`."""

    def encode(text: str) -> Sequence[int]:
        out = tokenizer.encode(text)
        return out.ids if hasattr(out, "ids") else out

    return encode


def _filler_counts(tokenizer: Any, lines: Sequence[str], encode: Encode) -> list[int]:
    key = id(tokenizer)
    if key not in _counts_cache:
        _counts_cache[key] = line_token_counts(lines, encode)
    return _counts_cache[key]


def _value(rng: random.Random, kind: str, encode: Encode, question: str) -> str:
    """A value of 1–3 tokens that `question` does not contain: a word value can be a word of the name
    (`beacon` for `--batch-beacon-code`), and an answer the question spells out is read from the question, so
    its recall would say nothing about the needle."""
    lo, hi = VALUE_TOKENS
    for _ in range(200):
        value = make_value(rng, kind)
        if lo <= len(encode(value)) <= hi and value not in question:
            return value
    raise RuntimeError(f"no {kind} value of {lo}-{hi} tokens found for this tokenizer")


def _snap(lines: Sequence[str], cum: Sequence[int], index: int) -> int:
    """The index after a blank line (a paragraph break) nearest in tokens to `index`, within SNAP_SHARE of the
    body; else `index` itself. `cum[i]` is the token count before line i."""
    reach = SNAP_SHARE * cum[-1]
    breaks = [
        i for i in range(1, len(lines)) if not lines[i - 1].strip() and abs(cum[i] - cum[index]) <= reach
    ]
    return min(breaks, key=lambda i: abs(cum[i] - cum[index]), default=index)


def make_probe(
    tokenizer: Any,
    seed: int,
    depth: float,
    n_tokens: int,
    family: str,
    n_distractors: int = 2,
    lines: Sequence[str] | None = None,
) -> Probe:
    """A prompt of about `n_tokens` tokens whose needle sits at `depth` (0 = start, 1 = just before the question)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown probe family {family!r}; available: {', '.join(FAMILIES)}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be between 0 and 1, got {depth}")
    if n_tokens < 64:
        raise ValueError(f"a probe needs at least 64 tokens, got {n_tokens}")
    fam = FAMILIES[family]
    rng = random.Random(f"kvlens-probe:{family}:{seed}:{depth:.4f}:{n_tokens}")
    encode = token_encoder(tokenizer)
    lines = filler_lines() if lines is None else lines
    counts = (
        _filler_counts(tokenizer, lines, encode)
        if lines is filler_lines()
        else line_token_counts(lines, encode)
    )

    names: list[str] = []
    while len(names) < 1 + n_distractors:
        candidate = make_name(rng, fam.style)
        if candidate not in names:
            names.append(candidate)
    question = fam.question(names[0])
    values = [_value(rng, fam.values, encode, question) for _ in names]
    bindings = [fam.binding(n, v) + "\n" for n, v in zip(names, values, strict=True)]
    fixed = len(encode(question)) + sum(len(encode(b)) for b in bindings)
    body = take_lines(lines, counts, rng, max(16, n_tokens - fixed))

    cum = [0]
    for line in body:
        cum.append(cum[-1] + len(encode(line)))
    total = cum[-1]

    def line_at(fraction: float) -> int:
        target = fraction * total
        return _snap(body, cum, next((i for i, c in enumerate(cum) if c >= target), len(body)))

    spots = [line_at(depth)]
    for _ in range(n_distractors):
        spots.append(line_at(rng.uniform(0.05, 0.95)))
    out = list(body)
    for spot, binding in sorted(zip(spots, bindings, strict=True), key=lambda p: p[0], reverse=True):
        out.insert(spot, binding)
    prompt = "".join(out) + question
    return Probe(
        prompt=prompt,
        answer=values[0],
        name=names[0],
        family=family,
        seed=seed,
        depth=depth,
        n_tokens=n_tokens,
        distractors=tuple(zip(names[1:], values[1:], strict=True)),
        needle=bindings[0],
    )
