"""The probe planner: every needle probe a grid asks for, checked before any model is loaded.

`kvlens probe` and the app's needle grid both plan here, so they build the same probes in the same order and
refuse the same values; both parse their text with `plan_from_text`, which checks each option as soon as it is
parsed, quoting it as typed, so the first bad option is the one named.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["check_depths", "check_families", "check_lengths", "plan_from_text", "plan_probes"]

#: Parses one comma-separated option: (text, element type, option name) -> values; raises naming the option.
Split = Callable[[str, type, str], list]

#: The shortest prompt a probe is built at (tokens): room for the needle, its question and some filler.
MIN_PROBE_TOKENS = 64


def _named(option: str, text: str | None) -> str:
    return f"--{option}" if text is None else f"--{option} {text!r}"


def check_families(families: Sequence[str]) -> None:
    """ValueError naming the unknown families and the available ones."""
    from kvcore.probes import FAMILIES

    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"--families: unknown {', '.join(unknown)}; available: {', '.join(FAMILIES)}")


def check_depths(depths: Sequence[float], text: str | None = None) -> None:
    """ValueError unless every depth is in [0, 1]; `text`, the option as typed, is quoted."""
    if any(not 0.0 <= d <= 1.0 for d in depths):
        raise ValueError(f"{_named('depths', text)}: each depth must be between 0 and 1")


def check_lengths(lengths: Sequence[int], text: str | None = None) -> None:
    """ValueError unless every length is at least MIN_PROBE_TOKENS; `text`, the option as typed, is quoted."""
    if any(n < MIN_PROBE_TOKENS for n in lengths):
        raise ValueError(f"{_named('lengths', text)}: each length must be at least {MIN_PROBE_TOKENS} tokens")


def plan_probes(
    families: Sequence[str],
    depths: Sequence[float],
    lengths: Sequence[int],
    seeds: int = 1,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """`make_probe` keyword arguments of every probe: families, then lengths, then depths, then `seeds` seeds
    from `seed`. ValueError names the first bad option."""
    check_families(families)
    check_depths(depths)
    check_lengths(lengths)
    if seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {seeds}")
    return [
        dict(family=f, depth=d, n_tokens=n, seed=seed + s)
        for f, n, d, s in itertools.product(families, lengths, depths, range(seeds))
    ]


def plan_from_text(
    families: str, depths: str, lengths: str, seeds: int, seed: int, split: Split
) -> list[dict[str, Any]]:
    """`plan_probes` of comma-separated options, each parsed by `split` and checked in turn."""
    family_names = split(families, str, "families")
    check_families(family_names)
    depth_values = split(depths, float, "depths")
    check_depths(depth_values, depths)
    length_values = split(lengths, int, "lengths")
    check_lengths(length_values, lengths)
    return plan_probes(family_names, depth_values, length_values, seeds, seed)
