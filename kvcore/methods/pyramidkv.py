"""pyramidkv (Cai et al. 2024): snapkv scores with more positions in lower layers (see kvcore.methods.budgets)."""

from __future__ import annotations

from dataclasses import dataclass

from kvcore.declared import param
from kvcore.defaults import PYRAMIDKV_BETA
from kvcore.methods.snapkv import SnapKV


@dataclass(frozen=True)
class PyramidKV(SnapKV):
    name = "pyramidkv"
    description = "snapkv's scores, with budgets that shrink from the lowest layer to the highest"
    paper = (
        "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling (Cai et al. 2024), "
        "arXiv:2406.02069"
    )
    budget = "pyramidkv"

    beta: int = param(
        PYRAMIDKV_BETA, "pyramid steepness: the top layer keeps 1/beta of the mean budget", minimum=1
    )
