"""TurboQuant (Zandieh, Daliri, Hadian, Mirrokni 2025, arXiv 2504.19874): a random rotation, then the optimal
scalar codebook per coordinate.

TurboQuant-MSE (`turboquant`): each row x [head_dim] keeps its norm ‖x‖ (float16) and the unit vector u = x/‖x‖ is
rotated at random (y = u·R, R seeded: `kvcore.quant.projections.random_rotation`). A rotated unit vector's
coordinates are ~ N(0, 1/d), so each is quantized with the b-bit Lloyd–Max codebook of that Gaussian
(`kvcore.quant.lloyd_max`): E‖x − x̂‖² ≈ ‖x‖²·D_b with D_b = 0.3634, 0.1175, 0.03454, 0.009497 at b = 1..4, the
values the paper's distortion bound rests on. Stored: d·b bits of codes (`kvcore.quant.bitpack`) and one float16
norm per row; R costs no bytes (regenerated from `seed`).

TurboQuant-prod (`turboquant_prod`): MSE codes are biased for inner products (they shrink them), so the second
stage spends one of the b bits on a 1-bit QJL sketch of the residual r = u − û: d sign bits of S·r (S Gaussian
d×d) and ‖r‖ (float16), giving x̂ = ‖x‖·(û + √(π/2)/d·‖r‖·Sᵀ·sign(S·r)), whose inner product with any y is unbiased.

Execution: simulated. Attention runs on a dequantized copy of the stored parts (`kvcore.model.attention`), which
gives the same scores as the estimator would computed on the codes; no genuine packed-form kernel is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

import mlx.core as mx

from kvcore.declared import param
from kvcore.quant.base import QuantScheme
from kvcore.quant.bitpack import pack_bits, unpack_bits
from kvcore.quant.layout import parts_refusal
from kvcore.quant.lloyd_max import gaussian_codebook
from kvcore.quant.projections import gaussian_sketch, random_rotation

PAPER = "Zandieh et al. 2025, arXiv 2504.19874"
#: Norms below this are treated as zero rows (their unit vector is taken as 0, so they decode to 0).
_TINY = 1e-30


@cache
def codebook(bits: int) -> tuple[mx.array, mx.array]:
    """(centroids [2^b], boundaries [2^b − 1]) of the b-bit Gaussian Lloyd–Max quantizer, float32 on the device."""
    centroids, bounds, _ = gaussian_codebook(bits)
    out = mx.array(centroids.astype("float32")), mx.array(bounds.astype("float32"))
    mx.eval(*out)
    return out


def norm_and_direction(x: mx.array) -> tuple[mx.array, mx.array]:
    """(‖x‖ [..., 1] float32, x/‖x‖ float32): a zero row has direction 0."""
    xf = x.astype(mx.float32)
    norm = mx.sqrt(mx.sum(xf * xf, axis=-1, keepdims=True))
    return norm, xf / mx.maximum(norm, _TINY)


@dataclass(frozen=True)
class TurboQuant(QuantScheme):
    name: ClassVar[str] = "turboquant"
    description: ClassVar[str] = (
        f"TurboQuant-MSE: random rotation, Gaussian Lloyd–Max codes per coordinate, a norm per vector; "
        f"simulated (attends on a dequantized copy) — {PAPER}"
    )
    genuine: ClassVar[bool] = False
    allowed_bits: ClassVar[tuple[int, ...]] = (1, 2, 3, 4)
    allowed_group_sizes: ClassVar[tuple[int, ...]] = (1,)
    mode: ClassVar[str] = "turboquant"
    own_layout: ClassVar[bool] = True

    group_size: int = param(1, "no groups: one norm per whole vector (head_dim)", minimum=1, maximum=1)
    seed: int = param(0, "seed of the random rotation (regenerated: no stored bytes)", minimum=0)

    @property
    def packer(self) -> str:
        return self.name

    @property
    def n_parts(self) -> int:
        """Codes and norms."""
        return 2

    def check(self, bits: Any, head_dim: int | None = None) -> None:
        """The width first, then a head_dim whose codes fill whole bytes (d·b bits: d a multiple of 8)."""
        refusal = self.bits_refusal(bits)
        if refusal is not None:
            raise ValueError(refusal)
        if head_dim is not None and head_dim % 8:
            raise ValueError(
                f"head_dim={head_dim} is not supported: {self.name} packs codes in whole bytes, so head_dim must "
                f"be a multiple of 8"
            )

    def layout_refusal(self, parts: tuple[mx.array, ...], bits: int, values: bool = False) -> str | None:
        """Codes uint8 d·b/8 wide and a float16 norm, d read from the codes' width."""
        d = parts[0].shape[-1] * 8 // bits
        return parts_refusal(parts, [(d * bits // 8, mx.uint8), (1, mx.float16)], ("codes", "norms"))

    def encode(self, u: mx.array, bits: int) -> mx.array:
        """Codes uint8 [..., d] of unit rows u: each rotated coordinate's Lloyd–Max interval."""
        d = u.shape[-1]
        y = (u @ random_rotation(d, int(self.seed))) * math.sqrt(d)
        _, bounds = codebook(bits)
        return mx.sum(mx.expand_dims(y, -1) > bounds, axis=-1).astype(mx.uint8)

    def decode(self, codes: mx.array, bits: int) -> mx.array:
        """Unit-scale rows [..., d] float32 of codes: centroids/√d, rotated back (·Rᵀ)."""
        d = codes.shape[-1]
        centroids, _ = codebook(bits)
        y = mx.take(centroids, codes.astype(mx.uint32)) / math.sqrt(d)
        return y @ random_rotation(d, int(self.seed)).T

    def pack(self, x: mx.array, bits: int) -> tuple[mx.array, ...]:
        """(codes uint8 [..., d·b/8], norm float16 [..., 1])."""
        self.check(bits, int(x.shape[-1]))
        norm, u = norm_and_direction(x)
        return pack_bits(self.encode(u, bits), bits), norm.astype(mx.float16)

    def unpack(self, parts: tuple[mx.array, ...], bits: int) -> mx.array:
        """x̂ = ‖x‖·û, float32."""
        packed, norm = parts
        return self.decode(unpack_bits(packed, bits), bits) * norm.astype(mx.float32)


@dataclass(frozen=True)
class TurboQuantProd(TurboQuant):
    name: ClassVar[str] = "turboquant_prod"
    description: ClassVar[str] = (
        f"TurboQuant-prod: (b−1)-bit TurboQuant-MSE plus a 1-bit QJL sketch of the residual, unbiased inner "
        f"products; simulated (attends on a dequantized copy) — {PAPER}"
    )
    allowed_bits: ClassVar[tuple[int, ...]] = (2, 3, 4)

    seed: int = param(
        0, "seed of the random rotation and of the residual's sketch (no stored bytes)", minimum=0
    )

    @property
    def n_parts(self) -> int:
        """MSE codes, residual sign bits, norm, residual norm."""
        return 4

    def layout_refusal(self, parts: tuple[mx.array, ...], bits: int, values: bool = False) -> str | None:
        """MSE codes, sign bits (d/8, d read from them), a norm and a residual norm."""
        d = parts[1].shape[-1] * 8 if len(parts) > 1 else 0
        want = [(d * (bits - 1) // 8, mx.uint8), (d // 8, mx.uint8), (1, mx.float16), (1, mx.float16)]
        return parts_refusal(parts, want, ("codes", "signs", "norms", "residual norms"))

    def pack(self, x: mx.array, bits: int) -> tuple[mx.array, ...]:
        """(codes uint8 [..., d·(b−1)/8], signs uint8 [..., d/8], ‖x‖ float16 [..., 1], ‖r‖ float16 [..., 1])."""
        self.check(bits, int(x.shape[-1]))
        d = int(x.shape[-1])
        norm, u = norm_and_direction(x)
        codes = self.encode(u, bits - 1)
        residual = u - self.decode(codes, bits - 1)
        r_norm = mx.sqrt(mx.sum(residual * residual, axis=-1, keepdims=True))
        signs = (residual @ gaussian_sketch(d, d, int(self.seed)).T) >= 0
        return (
            pack_bits(codes, bits - 1),
            pack_bits(signs, 1),
            norm.astype(mx.float16),
            r_norm.astype(mx.float16),
        )

    def unpack(self, parts: tuple[mx.array, ...], bits: int) -> mx.array:
        """x̂ = ‖x‖·(û + √(π/2)/d·‖r‖·Sᵀ·sign(S·r)), float32."""
        packed, signs, norm, r_norm = parts
        codes = unpack_bits(packed, bits - 1)
        d = codes.shape[-1]
        pm = unpack_bits(signs, 1).astype(mx.float32) * 2 - 1
        sketch = (pm @ gaussian_sketch(d, d, int(self.seed))) * (math.sqrt(math.pi / 2) / d)
        return (self.decode(codes, bits - 1) + sketch * r_norm.astype(mx.float32)) * norm.astype(mx.float32)
