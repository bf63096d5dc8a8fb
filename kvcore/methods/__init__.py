"""Compression methods, found by module: every `Method` subclass with a `name` in a module of this package.

A new method is one new file here; nothing else lists methods. Wrappers compose by name: `adakv-h2o` is AdaKV over
h2o, and bare `adakv` wraps the wrapper's `default_inner` (snapkv). `get("random", seed=3)` sets parameters.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from kvcore.declared import Parameter, discover
from kvcore.methods.base import Method

__all__ = ["Method", "Parameter", "available", "describe", "get", "paper", "summary"]


@cache
def _classes() -> dict[str, type[Method]]:
    """name -> class, for every method class defined in a module of this package (imported on first use)."""
    return discover(__name__, __path__, Method, "methods")


@cache
def available() -> tuple[str, ...]:
    """Every name `get` accepts but `A+B` chains: the scorers (full first, then by name, those that pick their own
    positions last), then each wrapper bare and over each scorer it can wrap."""
    classes = _classes()
    scorers = sorted(
        (n for n, c in classes.items() if not c.wraps),
        key=lambda n: (not classes[n].keeps_everything, classes[n].chooses, n),
    )
    names = list(scorers)
    for wrapper in sorted(n for n, c in classes.items() if c.wraps):
        names.append(wrapper)
        names += [f"{wrapper}-{s}" for s in scorers if classes[wrapper].refusal(classes[s]) is None]
    return tuple(names)


def get(name: str, **values: Any) -> Method:
    """The method called `name` with these parameters (the others at their defaults); ValueError naming the
    allowed names or parameters otherwise. `A+B` chains methods (kvcore.methods.composed)."""
    if not isinstance(name, str):
        raise ValueError(f"unknown method {name!r}; {summary()}")
    if "+" in name:
        method = _classes()["composed"].chain(name, get)  # type: ignore[attr-defined]
        return method.with_values(**values) if values else method
    wrapper, _, inner = name.partition("-")
    classes = _classes()
    if wrapper in classes and classes[wrapper].wraps and inner in classes:
        why = classes[wrapper].refusal(classes[inner])
        if why is not None:
            raise ValueError(why)
    if name not in available():
        raise ValueError(f"unknown method {name!r}; {summary()}; `kvlens methods` lists them all")
    cls = classes[wrapper] if wrapper in classes and classes[wrapper].wraps else None
    method = classes[name]() if cls is None else cls(inner=classes[inner or cls.default_inner]())
    return method.with_values(**values) if values else method


def summary() -> str:
    """The names in short, for refusals and --help: the methods, the wrappers (each bare or over a method), chains."""
    classes = _classes()
    bare = [n for n in available() if "-" not in n]
    plain = ", ".join(n for n in bare if not classes[n].wraps)
    wrappers = ", ".join(n for n in bare if classes[n].wraps)
    return (
        f"methods: {plain}; wrappers (bare, or WRAPPER-METHOD as adakv-h2o): {wrappers}; "
        "chains: A+B (snapkv+knorm)"
    )


def describe(name: str) -> str:
    """The method's one-line description (a wrapper's, then its inner method's)."""
    method = get(name)
    inner = getattr(method, "inner", None)
    return (
        method.description
        if inner is None
        else f"{method.description}; over {inner.label}: {inner.description}"
    )


def paper(name: str) -> str:
    """The method's paper (a wrapper's, then its inner method's)."""
    method = get(name)
    inner = getattr(method, "inner", None)
    return method.paper if inner is None else f"{method.paper}; over {inner.label}: {inner.paper}"
