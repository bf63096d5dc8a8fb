"""Rotated: a seeded randomized Hadamard rotation of head_dim, then affine packing (QuaRot, Ashkboos et al. 2024;
RotateKV, Su et al. 2025).

Keys carry a few outlier channels that set every group's scale; an orthogonal rotation R = diag(signs)·H/√d spreads
them over all channels before mx.quantize's affine groups, so 4-bit codes lose less. Rows are stored as x·R; R is
regenerated from `seed` (random signs) and mx.hadamard_transform, so it costs no stored bytes. Attention stays
genuine: q·(k·R)ᵀ = (q·R)·(k·R)ᵀ = q·kᵀ, so queries are rotated before the packed key product, and
w·(v·R)·Rᵀ = w·v, so the packed value product is rotated back (`kvcore.model.attention.quantized_or_float_matmul`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

import mlx.core as mx
import numpy as np

from kvcore.declared import param
from kvcore.defaults import ALLOWED_BITS, ALLOWED_GROUP_SIZES, DEFAULT_GROUP_SIZE
from kvcore.quant.base import QuantScheme

#: Odd factors m of the sizes m·2^k that mx.hadamard_transform takes (it aborts the process on others).
HADAMARD_FACTORS: tuple[int, ...] = (1, 12, 20, 28)


def hadamard_refusal(head_dim: int) -> str | None:
    """Why head_dim cannot be rotated by mx.hadamard_transform, or None."""
    d = int(head_dim)
    for m in HADAMARD_FACTORS:
        if d >= m and d % m == 0 and (d // m) & (d // m - 1) == 0:
            return None
    return (
        f"head_dim={head_dim} is not supported: the rotated scheme's Hadamard rotation takes head_dim = 2^k or "
        f"12·2^k, 20·2^k, 28·2^k (e.g. 64, 80, 96, 112, 128, 160, 192, 256)"
    )


@cache
def rotation_matrix(head_dim: int, seed: int) -> mx.array:
    """R [head_dim, head_dim] float32, rows rotated as x·R = hadamard(x·signs): orthogonal (R·Rᵀ = I)."""
    refusal = hadamard_refusal(head_dim)
    if refusal is not None:
        raise ValueError(refusal)
    signs = np.random.default_rng(seed).choice(np.array([-1.0, 1.0], dtype=np.float32), size=head_dim)
    hadamard = mx.hadamard_transform(mx.eye(head_dim, dtype=mx.float32))  # x·H/√d for every basis row x
    r = mx.array(signs)[:, None] * hadamard
    mx.eval(r)
    return r


@dataclass(frozen=True)
class Rotated(QuantScheme):
    name: ClassVar[str] = "rotated"
    description: ClassVar[str] = (
        "seeded randomized Hadamard rotation of head_dim, then affine (QuaRot/RotateKV)"
    )
    allowed_bits: ClassVar[tuple[int, ...]] = ALLOWED_BITS
    allowed_group_sizes: ClassVar[tuple[int, ...]] = ALLOWED_GROUP_SIZES
    mode: ClassVar[str] = "affine"
    has_biases: ClassVar[bool] = True

    group_size: int = param(
        DEFAULT_GROUP_SIZE, "elements of rotated head_dim sharing one scale and bias", minimum=32, maximum=128
    )
    seed: int = param(0, "seed of the rotation's random signs (regenerates it: no stored bytes)", minimum=0)

    def check(self, bits: Any, head_dim: int | None = None) -> None:
        """A head_dim the Hadamard transform takes (named first: no group size helps otherwise), then affine's."""
        refusal = None if head_dim is None else hadamard_refusal(head_dim)
        if refusal is not None:
            raise ValueError(refusal)
        super().check(bits, head_dim)

    def rotate(self, x: mx.array) -> mx.array:
        """x·R along the last axis, computed in float32, returned in x's dtype."""
        r = rotation_matrix(int(x.shape[-1]), int(self.seed))
        return (x.astype(mx.float32) @ r).astype(x.dtype)

    def unrotate(self, x: mx.array) -> mx.array:
        """x·Rᵀ along the last axis: undoes `rotate`."""
        r = rotation_matrix(int(x.shape[-1]), int(self.seed))
        return (x.astype(mx.float32) @ r.T).astype(x.dtype)

    def pack(self, x: mx.array, bits: int) -> tuple[mx.array, ...]:
        """Affine codes, scales and biases of the rotated rows x·R."""
        return super().pack(self.rotate(x), bits)

    def unpack(self, parts: tuple[mx.array, ...], bits: int) -> mx.array:
        """The float rows, rotated back: dequantize(parts)·Rᵀ."""
        return self.unrotate(super().unpack(parts, bits))
