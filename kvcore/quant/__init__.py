"""Quantization schemes, found by module: every `QuantScheme` subclass with a `name` in a module of this package.

A new scheme is one new file here; nothing else lists schemes. `get("affine", group_size=32)` sets parameters.
The float residual beside a packed cache is an option of every scheme (`kvcore.cache.residual`).
"""

from __future__ import annotations

from functools import cache

from kvcore.declared import discover
from kvcore.defaults import DEFAULT_QUANT
from kvcore.quant.base import QuantScheme

__all__ = ["QuantScheme", "available", "get"]


@cache
def _classes() -> dict[str, type[QuantScheme]]:
    """name -> class, for every scheme class defined in a module of this package (imported on first use)."""
    return discover(__name__, __path__, QuantScheme, "quantization schemes")


@cache
def available() -> tuple[str, ...]:
    """Every name `get` accepts: the default scheme first, then by name."""
    return tuple(sorted(_classes(), key=lambda n: (n != DEFAULT_QUANT, n)))


def get(name: str = DEFAULT_QUANT, **values: int | float) -> QuantScheme:
    """The scheme called `name` with these parameters (the others at their defaults); one-line ValueError naming
    the allowed names or parameters otherwise."""
    if name not in available():
        raise ValueError(f"unknown quantization scheme {name!r}; available: {', '.join(available())}")
    cls = _classes()[name]
    unknown = sorted(set(values) - {p.name for p in cls.parameters()})
    if unknown:
        have = ", ".join(p.name for p in cls.parameters()) or "none"
        raise ValueError(f"{name} has no parameter {', '.join(unknown)} (its parameters: {have})")
    return cls(**values)
