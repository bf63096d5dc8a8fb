"""Compression methods by name: `get("snapkv")`, `get("adakv")` (adakv over snapkv), `get("adakv-h2o")`."""

from __future__ import annotations

from kvcore.methods.adakv import AdaKV
from kvcore.methods.base import Method, MethodParams
from kvcore.methods.expected_attention import ExpectedAttention
from kvcore.methods.full import Full
from kvcore.methods.h2o import H2O
from kvcore.methods.knorm import KNorm
from kvcore.methods.pyramidkv import PyramidKV
from kvcore.methods.random_scores import Random
from kvcore.methods.snapkv import SnapKV
from kvcore.methods.streaming_llm import StreamingLLM
from kvcore.methods.tova import TOVA

__all__ = ["Method", "MethodParams", "available", "get"]

_SCORERS: dict[str, type[Method]] = {
    cls.name: cls
    for cls in (Full, StreamingLLM, SnapKV, H2O, TOVA, KNorm, Random, PyramidKV, ExpectedAttention)
}
_ADAKV_INNER = ("snapkv", "h2o", "knorm", "random", "pyramidkv", "expected_attention")


def available() -> tuple[str, ...]:
    """Every name `get` accepts."""
    return (*_SCORERS, "adakv", *(f"adakv-{name}" for name in _ADAKV_INNER))


def get(name: str) -> Method:
    """The method called `name`; ValueError naming the allowed names otherwise."""
    if name in _SCORERS:
        return _SCORERS[name]()
    if name == "adakv":
        return AdaKV(SnapKV())
    if name.startswith("adakv-") and name[len("adakv-") :] in _ADAKV_INNER:
        return AdaKV(_SCORERS[name[len("adakv-") :]]())
    raise ValueError(f"unknown method {name!r}; available: {', '.join(available())}")
