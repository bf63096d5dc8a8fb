"""per_layer_compression (kvpress's PerLayerCompressionPress): the inner method with a ratio of its own per layer.

Layers differ in how much of the prompt they need (the pyramid methods' premise); here the user sets it: layer l
keeps max(1, int(T · layer_ratios[l])) positions per kv-head by the inner method's ranking. With no list, every
layer keeps the run's ratio; with one, the run's ratio is not used. kvpress takes compression ratios (1 − r).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcore.declared import param
from kvcore.methods import budgets
from kvcore.methods.wrapper import Wrapper


@dataclass(frozen=True)
class PerLayerCompression(Wrapper):
    name = "per_layer_compression"
    description = (
        "The inner method with its own kept fraction per layer (layer_ratios; empty: the run's ratio)"
    )
    paper = "none: kvpress's PerLayerCompressionPress (github.com/NVIDIA/kvpress)"
    default_inner = "snapkv"
    budget = "uniform"

    layer_ratios: tuple[float, ...] = param(
        (),
        "fraction kept in each layer, one per layer (e.g. 0.1,0.3,...); empty: the run's ratio",
        minimum=0.0,
        maximum=1.0,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for r in self.layer_ratios:
            budgets.check_ratio(r)

    def counts(self, n_tokens: int, ratio: float, n_layers: int) -> list[int] | None:
        budgets.check_ratio(ratio)
        if not self.layer_ratios:
            return None
        if len(self.layer_ratios) != n_layers:
            raise ValueError(
                f"{self.label}: layer_ratios has {len(self.layer_ratios)} values but the model has {n_layers} "
                f"layers: give one ratio per layer (--param layer_ratios=r0,r1,...)"
            )
        return [budgets.n_kept(n_tokens, r) for r in self.layer_ratios]
