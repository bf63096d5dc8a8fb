"""`kvlens methods`: every method the engine discovers, with its one-line definition and declared parameters."""

from __future__ import annotations

from kvcore.methods import available, describe, get


def method_lines() -> list[str]:
    """One line a method (its name and definition), then one indented line a parameter (default and help)."""
    lines = []
    for name in available():
        lines.append(f"{name}: {describe(name)}")
        for p in get(name).parameters():
            lines.append(f"    --param {f'{p.name}={p.default}':<14} {p.help}")
    return lines
