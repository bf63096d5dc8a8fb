"""KIVI (Liu et al., ICML 2024): keys quantized per channel, values per token, the most recent tokens kept float.

Keys have outlier *channels* (a few head_dim coordinates large for every token), so KIVI groups keys along tokens:
each channel's `group_size` consecutive tokens share a scale and a bias; values have no such channels and are
grouped per token along head_dim, as affine does. Token groups must be whole, so the last `residual` tokens (and
the ragged end that does not fill a group) stay float; decoding appends to them and packs a group when one fills
(`kvcore.cache.kivi.KiviKVCache`).

Execution is genuine: keys are stored transposed, Kᵀ [head_dim, T] quantized along T, so the scores q·Kᵀ are
`mx.quantized_matmul(q, Kᵀ packed, transpose=False)`; values go through the usual packed product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import mlx.core as mx

from kvcore.declared import param
from kvcore.defaults import ALLOWED_BITS, ALLOWED_GROUP_SIZES, KIVI_GROUP_SIZE, KIVI_RESIDUAL
from kvcore.quant.base import QuantScheme


@dataclass(frozen=True)
class Kivi(QuantScheme):
    name: ClassVar[str] = "kivi"
    description: ClassVar[str] = (
        "keys per channel (groups along tokens), values per token, the last tokens float — KIVI, Liu et al. 2024, "
        "arXiv 2402.02750"
    )
    allowed_bits: ClassVar[tuple[int, ...]] = ALLOWED_BITS
    allowed_group_sizes: ClassVar[tuple[int, ...]] = ALLOWED_GROUP_SIZES
    mode: ClassVar[str] = "affine"
    has_biases: ClassVar[bool] = True
    per_channel_keys: ClassVar[bool] = True

    group_size: int = param(
        KIVI_GROUP_SIZE,
        "tokens sharing a key channel's scale and bias; elements of head_dim sharing a value's",
        minimum=32,
        maximum=128,
    )
    residual: int = param(KIVI_RESIDUAL, "most recent tokens kept float (token groups stay whole)", minimum=0)

    @property
    def packer(self) -> str:
        return "kivi (affine codes, keys per channel)"

    def n_packed(self, n_tokens: int) -> int:
        """How many of `n_tokens` (oldest first) are packed: whole groups, at least `residual` left float."""
        return max(0, (n_tokens - self.residual) // self.group_size) * self.group_size

    def check_tokens(self, n_tokens: int) -> None:
        """One-line ValueError when the float residual is longer than the tokens there are to store."""
        if self.residual > n_tokens:
            raise ValueError(
                f"kivi: residual={self.residual} is longer than the {n_tokens} positions to store: use residual "
                f"<= {n_tokens} ({self.name}:residual=N)"
            )

    def pack_keys(self, keys: mx.array, bits: int) -> tuple[mx.array, ...]:
        """Kᵀ quantized along tokens: keys [..., T, head_dim] (T a multiple of group_size) -> codes
        [..., head_dim, T·bits/32], scales and biases [..., head_dim, T/group_size]."""
        if keys.shape[-2] % self.group_size:
            raise ValueError(
                f"kivi packs whole token groups: {keys.shape[-2]} tokens is not a multiple of {self.group_size}"
            )
        return tuple(mx.quantize(mx.swapaxes(keys, -1, -2), group_size=self.group_size, bits=bits))

    def unpack_keys(self, parts: tuple[mx.array, ...], bits: int) -> mx.array:
        """The float keys [..., T, head_dim] that `pack_keys` parts hold."""
        return mx.swapaxes(mx.dequantize(*parts, group_size=self.group_size, bits=bits), -1, -2)
