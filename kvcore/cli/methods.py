"""`kvlens methods`: every method the engine discovers, with its one-line definition, its paper and declared
parameters."""

from __future__ import annotations

from kvcore.methods import available, describe, get, paper


def method_lines() -> list[str]:
    """One line a method (its name and definition), an indented line with its paper, then one a parameter (default
    and help)."""
    lines = []
    for name in available():
        lines.append(f"{name}: {describe(name)}")
        lines.append(f"    paper: {paper(name)}")
        for p in get(name).parameters():
            lines.append(f"    --param {f'{p.name}={p.default}':<14} {p.help}")
    return lines
