"""pyramidkv (Cai et al. 2024): snapkv scores with more positions in lower layers (see kvcore.methods.budgets)."""

from __future__ import annotations

from kvcore.methods.snapkv import SnapKV


class PyramidKV(SnapKV):
    name = "pyramidkv"
    budget = "pyramidkv"
