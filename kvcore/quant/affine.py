"""Affine: MLX's integer quantization (mx.quantize's default mode), a float scale and bias per group of head_dim.

Each group of `group_size` consecutive elements of a row stores `bits`-bit codes, a scale and a bias in the rows'
float dtype: x ≈ scale · code + bias. KV Lens's first scheme, and mlx-lm's QuantizedKVCache's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvcore.declared import param
from kvcore.defaults import ALLOWED_BITS, ALLOWED_GROUP_SIZES, DEFAULT_GROUP_SIZE
from kvcore.quant.base import QuantScheme


@dataclass(frozen=True)
class Affine(QuantScheme):
    name: ClassVar[str] = "affine"
    description: ClassVar[str] = "integer codes with a float scale and bias per group (mx.quantize affine)"
    allowed_bits: ClassVar[tuple[int, ...]] = ALLOWED_BITS
    allowed_group_sizes: ClassVar[tuple[int, ...]] = ALLOWED_GROUP_SIZES
    mode: ClassVar[str] = "affine"
    has_biases: ClassVar[bool] = True

    group_size: int = param(
        DEFAULT_GROUP_SIZE, "elements of head_dim sharing one scale and bias", minimum=32, maximum=128
    )
