"""Quantization schemes, found by module: every `QuantScheme` subclass with a `name` in a module of this package.

A new scheme is one new file here; nothing else lists schemes. `get("affine", group_size=32)` sets parameters.
The float residual beside a packed cache is an option of every scheme (`kvcore.cache.residual`).
A scheme's other parameters travel in its name as a spec, "rotated:packing=mxfp4,seed=3" (`QuantScheme.spec`), so
every place that carries a scheme's name (configurations, cache states and files, CSVs, `--quant`) carries them.
"""

from __future__ import annotations

from functools import cache

from kvcore.declared import discover
from kvcore.defaults import DEFAULT_QUANT
from kvcore.quant.base import QuantScheme

__all__ = ["QuantScheme", "available", "get", "parse_spec"]


@cache
def _classes() -> dict[str, type[QuantScheme]]:
    """name -> class, for every scheme class defined in a module of this package (imported on first use)."""
    return discover(__name__, __path__, QuantScheme, "quantization schemes")


@cache
def available() -> tuple[str, ...]:
    """Every name `get` accepts: the default scheme first, then by name."""
    return tuple(sorted(_classes(), key=lambda n: (n != DEFAULT_QUANT, n)))


def parse_spec(spec: str) -> tuple[str, dict[str, int | float]]:
    """("rotated", {"packing": 1, "seed": 3}) from "rotated:packing=mxfp4,seed=3"; a choice by name or code."""
    name, _, rest = str(spec).partition(":")
    if name not in available():
        raise ValueError(f"unknown quantization scheme {name!r}; available: {', '.join(available())}")
    declared = {p.name: p for p in _classes()[name].parameters()}
    values: dict[str, int | float] = {}
    for item in filter(None, rest.split(",")):
        key, eq, text = item.partition("=")
        p = declared.get(key.strip())
        if not eq or p is None:
            have = ", ".join(declared) or "none"
            raise ValueError(f"{spec!r}: write {name}:NAME=VALUE,… with NAME one of {have}")
        text = text.strip()
        try:
            values[p.name] = p.choices.index(text) if text in p.choices else p.kind(text)
        except ValueError:
            allowed = f"one of {', '.join(p.choices)}" if p.choices else f"a {p.kind.__name__}"
            raise ValueError(f"{spec!r}: {p.name} must be {allowed}, got {text!r}") from None
    return name, values


def get(name: str = DEFAULT_QUANT, **values: int | float) -> QuantScheme:
    """The scheme called `name` (a spec, `parse_spec`, may carry parameters) with these parameters (the others at
    their defaults; a keyword overrides the spec); one-line ValueError naming the allowed names or parameters
    otherwise."""
    name, in_spec = parse_spec(name)
    values = {**in_spec, **values}
    if name not in available():
        raise ValueError(f"unknown quantization scheme {name!r}; available: {', '.join(available())}")
    cls = _classes()[name]
    unknown = sorted(set(values) - {p.name for p in cls.parameters()})
    if unknown:
        have = ", ".join(p.name for p in cls.parameters()) or "none"
        raise ValueError(f"{name} has no parameter {', '.join(unknown)} (its parameters: {have})")
    return cls(**values)
