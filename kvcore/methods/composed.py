"""composed (kvpress's ComposedPress): methods chained, each compressing what the one before it kept.

Named `A+B` (`snapkv+knorm`). The chain keeps the run's ratio r overall: each of its k stages keeps r^(1/k) of
the positions it is given (kvpress gives each press its own ratio; the product is the chain's). The first stage
ranks the prompt as it would alone; a later stage sees only the kept keys and values, so it must score from
keys and values alone (knorm, keydiff, lagkv): queries were captured for the whole prompt, not for a subset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import Parameter
from kvcore.methods.base import Method, Pick
from kvcore.methods.budgets import n_kept
from kvcore.methods.knorm import KNorm
from kvcore.methods.snapkv import SnapKV
from kvcore.methods.wrapper import subset


def _default_stages() -> tuple[Method, ...]:
    return (SnapKV(), KNorm())


@dataclass(frozen=True)
class Composed(Method):
    name = "composed"
    description = "Methods chained (A+B): each keeps r^(1/k) of what the previous one kept"
    paper = "none: kvpress's ComposedPress (github.com/NVIDIA/kvpress)"
    chooses = True

    stages: tuple[Method, ...] = dataclasses.field(default_factory=_default_stages)

    @classmethod
    def chain(cls, name: str, get: Callable[[str], Method]) -> Composed:
        """The `A+B+...` chain (`get` builds each member); ValueError naming the fix for an empty, unknown or
        unchainable member."""
        parts = name.split("+")
        if len(parts) < 2 or not all(p.strip() for p in parts):
            raise ValueError(
                f"{name!r} chains nothing after or before a '+': name two methods or more, as snapkv+knorm"
            )
        return cls(stages=tuple(get(p.strip()) for p in parts))

    def __post_init__(self) -> None:
        label = "+".join(s.label for s in self.stages)
        first, *later = self.stages
        if len(self.stages) < 2:
            raise ValueError(f"composed needs two methods or more, got {label!r}: name them as snapkv+knorm")
        for stage in self.stages:
            if stage.keeps_everything or stage.chooses or stage.wraps:
                raise ValueError(
                    f"{label}: {stage.label} cannot be a stage (it keeps everything, or picks its own positions): "
                    "chain plain scorers, as snapkv+knorm"
                )
        for stage in later:
            if not stage.scores_from_cache:
                raise ValueError(
                    f"{label}: {stage.label} scores from queries, which a later stage cannot see for the kept "
                    "positions: put it first, or chain a scorer of keys and values (knorm, keydiff, lagkv)"
                )

    @property
    def label(self) -> str:
        return "+".join(s.label for s in self.stages)

    @property
    def needs_h2o(self) -> bool:  # type: ignore[override]
        return self.stages[0].needs_h2o

    @property
    def needs_query_stats(self) -> bool:  # type: ignore[override]
        return self.stages[0].needs_query_stats

    def parameters(self) -> tuple[Parameter, ...]:
        seen: dict[str, Parameter] = {}
        for stage in self.stages:
            for p in stage.parameters():
                seen.setdefault(p.name, p)
        return tuple(seen.values())

    def values(self) -> dict[str, Any]:
        return {k: v for stage in reversed(self.stages) for k, v in stage.values().items()}

    def with_values(self, **values: Any) -> Method:
        """Each value goes to every stage that declares a parameter of that name."""
        self.check_names(values)
        stages = []
        for stage in self.stages:
            mine = {k: v for k, v in values.items() if k in {p.name for p in stage.parameters()}}
            stages.append(stage.with_values(**mine) if mine else stage)
        return dataclasses.replace(self, stages=tuple(stages))

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        return self.stages[0].scores(obs, layer)

    def always_kept(self, n_tokens: int) -> np.ndarray:
        return self.stages[0].always_kept(n_tokens)

    def choose(self, pick: Pick) -> np.ndarray:
        n_heads, n_tokens = pick.scores.shape
        step = pick.ratio ** (1 / len(self.stages))
        kept = pick.order[:, : n_kept(n_tokens, step)]
        for stage in self.stages[1:]:
            kept = np.sort(kept, axis=1)
            scores = np.array(stage.scores(subset(pick.obs, kept), pick.layer), np.float32)
            n = n_kept(kept.shape[1], step)
            kept = np.take_along_axis(kept, np.argsort(-scores, axis=1, kind="stable")[:, :n], axis=1)
        return np.sort(kept, axis=1).astype(np.int32)
