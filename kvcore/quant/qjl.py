"""QJL (Zandieh, Daliri, Han 2024, arXiv 2406.03482): keys as a 1-bit Johnson–Lindenstrauss sketch, values affine.

A key k [head_dim] is stored as the signs of m = bits·head_dim Gaussian projections S·k (S [m, d], seeded, not
stored) and its norm ‖k‖ (float16): bits per channel = m/d, plus the norm. The paper's estimator of a score,
q·k ≈ √(π/2)/m·‖k‖·⟨S·q, sign(S·k)⟩, is unbiased with variance at most π/(2m)·‖q‖²‖k‖². Values are not sketched
(the weighted sum needs the vectors, not inner products): they are packed by mx.quantize's affine groups at the
value width, as the `affine` scheme would.

Execution: simulated. The keys are dequantized as k̂ = √(π/2)/m·‖k‖·Sᵀ·sign(S·k), so q·k̂ is exactly the estimator;
attention then runs on that copy and on the dequantized values (`kvcore.model.attention`).
Stored parts: keys (signs uint8 [..., m/8], norm float16 [..., 1]), values (codes, scales, biases) as affine's;
`unpack` tells the two sides apart by their number of parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import mlx.core as mx

from kvcore.declared import param
from kvcore.defaults import ALLOWED_BITS, ALLOWED_GROUP_SIZES, DEFAULT_GROUP_SIZE
from kvcore.quant.base import QuantScheme
from kvcore.quant.bitpack import pack_bits, unpack_bits
from kvcore.quant.layout import affine_widths, parts_refusal
from kvcore.quant.projections import gaussian_sketch

PAPER = "Zandieh et al. 2024, arXiv 2406.03482"


@dataclass(frozen=True)
class QJL(QuantScheme):
    name: ClassVar[str] = "qjl"
    description: ClassVar[str] = (
        f"QJL: keys as signs of bits·head_dim Gaussian projections and a norm (unbiased scores), values affine; "
        f"simulated (attends on a dequantized copy) — {PAPER}"
    )
    genuine: ClassVar[bool] = False
    allowed_bits: ClassVar[tuple[int, ...]] = ALLOWED_BITS
    allowed_group_sizes: ClassVar[tuple[int, ...]] = ALLOWED_GROUP_SIZES
    mode: ClassVar[str] = "affine"  # the values' packing
    has_biases: ClassVar[bool] = True
    own_layout: ClassVar[bool] = True

    group_size: int = param(
        DEFAULT_GROUP_SIZE, "elements of a value row sharing one scale and bias", minimum=32, maximum=128
    )
    seed: int = param(0, "seed of the keys' Gaussian projections (regenerated: no stored bytes)", minimum=0)

    @property
    def packer(self) -> str:
        return f"{self.name} (keys sketched, values by mx.quantize)"

    @property
    def n_parts(self) -> int:
        """The keys' parts: sign bits and norms (values store affine's three)."""
        return 2

    @property
    def n_value_parts(self) -> int:
        """Affine's codes, scales and biases."""
        return 3

    def layout_refusal(self, parts: tuple[mx.array, ...], bits: int, values: bool = False) -> str | None:
        """Keys: sign bits (m = bits·d) and a float16 norm; values: affine's parts at the file's group size."""
        if not values:
            return parts_refusal(parts, [(parts[0].shape[-1], mx.uint8), (1, mx.float16)], ("signs", "norms"))
        d = parts[0].shape[-1] * 32 // bits
        scales = parts[1].dtype if len(parts) > 1 else mx.float32
        want = affine_widths(
            d, bits, self.group_size, scales if mx.issubdtype(scales, mx.floating) else mx.float32
        )
        return parts_refusal(parts, want, ("codes", "scales", "biases"))

    def pack(self, x: mx.array, bits: int) -> tuple[mx.array, ...]:
        """Keys: (signs of S·k uint8 [..., bits·d/8], ‖k‖ float16 [..., 1])."""
        self.check(bits, int(x.shape[-1]))
        d = int(x.shape[-1])
        xf = x.astype(mx.float32)
        norm = mx.sqrt(mx.sum(xf * xf, axis=-1, keepdims=True))
        signs = (xf @ gaussian_sketch(bits * d, d, int(self.seed)).T) >= 0
        return pack_bits(signs, 1), norm.astype(mx.float16)

    def pack_values(self, x: mx.array, bits: int) -> tuple[mx.array, ...]:
        """Values: affine codes, scales and biases (mx.quantize)."""
        return super().pack(x, bits)

    def unpack(self, parts: tuple[mx.array, ...], bits: int) -> mx.array:
        """Keys (two parts): k̂ = √(π/2)/m·‖k‖·Sᵀ·sign(S·k), float32; values (three parts): affine's rows."""
        if len(parts) != 2:
            return super().unpack(parts, bits)
        signs, norm = parts
        m = signs.shape[-1] * 8
        d = m // bits
        pm = unpack_bits(signs, 1).astype(mx.float32) * 2 - 1
        scale = math.sqrt(math.pi / 2) / m
        return (pm @ gaussian_sketch(m, d, int(self.seed))) * (scale * norm.astype(mx.float32))
