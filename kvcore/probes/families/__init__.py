"""One probe template family per file; `FAMILIES` maps each name to its Family, training and held-out apart."""

from __future__ import annotations

import importlib
import pkgutil

from kvcore.probes.base import Family


def _load() -> dict[str, Family]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        family = importlib.import_module(f"{__name__}.{info.name}").FAMILY
        found[family.name] = family
    return found


FAMILIES: dict[str, Family] = _load()
TRAIN_FAMILIES: tuple[str, ...] = tuple(n for n, f in FAMILIES.items() if not f.held_out)
HELDOUT_FAMILIES: tuple[str, ...] = tuple(n for n, f in FAMILIES.items() if f.held_out)
