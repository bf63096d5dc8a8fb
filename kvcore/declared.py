"""Declared parameters: a field that carries its default, a one-line help and its limits.

Methods (`kvcore.methods`) and quantization schemes (`kvcore.quant`) are frozen dataclasses whose fields are
declared with `param`, so the GUI's widgets, the CLI's `--param NAME=VALUE`, session files and CSV columns read
one declaration instead of a list kept elsewhere.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Parameter:
    """One declared hyper-parameter, as the GUI and the CLI present it."""

    name: str
    default: int | float | tuple[float, ...]
    help: str
    minimum: float | None = None
    maximum: float | None = None
    odd: bool = False
    #: Names of an integer-coded choice: value i means choices[i] (`--quant rotated:packing=mxfp4` takes either).
    choices: tuple[str, ...] = ()

    @property
    def kind(self) -> type:
        """int, float, or tuple (a list of numbers, one per layer): what a widget steps by and `--param` parses."""
        if isinstance(self.default, tuple):
            return tuple
        return float if isinstance(self.default, float) else int

    def check(self, owner: str, value: Any) -> None:
        """ValueError naming the owner, the parameter and the allowed values when `value` does not fit."""
        if self.kind is tuple:
            if not isinstance(value, tuple | list):
                raise ValueError(f"{self.name} must be a list of numbers (NAME=0.2,0.5,...), got {value!r}")
            for item in value:
                self.check_number(owner, float, item)
            return
        self.check_number(owner, self.kind, value)

    def check_number(self, owner: str, kind: type, value: Any) -> None:
        """The checks of one number of this parameter (kind int or float)."""
        numbers = (int, np.integer, float, np.floating) if kind is float else (int, np.integer)
        if isinstance(value, bool) or not isinstance(value, numbers):
            what = "a number" if kind is float else "an integer"
            raise ValueError(f"{self.name} must be {what}, got {value!r}")
        if self.choices and not 0 <= value < len(self.choices):
            named = ", ".join(f"{i} {c}" for i, c in enumerate(self.choices))
            raise ValueError(f"{owner} takes {self.name} in {named}, got {value!r}")
        if self.odd and value % 2 == 0:
            raise ValueError(f"{self.name} must be an odd integer >= {self.minimum:g}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            what = "an integer" if kind is int else "a number"
            raise ValueError(f"{self.name} must be {what} >= {self.minimum:g}, got {value!r}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"{owner} takes {self.name} up to {self.maximum:g}, got {value!r}")


def param(
    default: int | float | tuple[float, ...],
    help: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    odd: bool = False,
    choices: tuple[str, ...] = (),
) -> Any:
    """A declared parameter field: its default, a one-line help and its limits (checked on creation). `choices`
    names the values of an integer code 0 … len − 1 (a text choice that every widget and `--param` can carry)."""
    if choices:
        minimum, maximum = 0, len(choices) - 1
    meta = {"help": help, "minimum": minimum, "maximum": maximum, "odd": odd, "choices": tuple(choices)}
    return dataclasses.field(default=default, metadata={"parameter": meta})


def declared_parameters(cls: type) -> tuple[Parameter, ...]:
    """The parameters a dataclass declares with `param`, in field order."""
    return tuple(
        Parameter(f.name, f.default, **f.metadata["parameter"])
        for f in dataclasses.fields(cls)
        if "parameter" in f.metadata
    )


def discover(package: str, path: Iterable[str], base: type, what: str) -> dict[str, type]:
    """name -> class for every `base` subclass with a `name` defined in a module of `package` (on `path`): a new
    method or scheme is one new file. ValueError when two classes share a name, naming both modules."""
    found: dict[str, type] = {}
    for info in sorted(pkgutil.iter_modules(list(path)), key=lambda m: m.name):
        module = importlib.import_module(f"{package}.{info.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, base)
                and obj.__module__ == module.__name__
                and obj.name
            ):
                if obj.name in found and found[obj.name] is not obj:
                    raise ValueError(
                        f"two {what} are named {obj.name!r}: {found[obj.name].__module__} and {obj.__module__}"
                    )
                found[obj.name] = obj
    return found
