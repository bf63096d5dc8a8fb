"""Rotated: a seeded randomized Hadamard rotation of head_dim, then any of MLX's packings — affine, mxfp4, nvfp4,
mxfp8, chosen by `packing` (QuaRot, Ashkboos et al. 2024; RotateKV, Su et al. 2025).

Keys carry a few outlier channels that set every group's scale; an orthogonal rotation R = diag(signs)·H/√d spreads
them over all channels before mx.quantize's affine groups, so 4-bit codes lose less. Rows are stored as x·R; R is
regenerated from `seed` (random signs) and mx.hadamard_transform, so it costs no stored bytes. The inner packing
sets the widths and group sizes allowed (`rotated:packing=mxfp4` packs 4 bits in groups of 32). Attention stays
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
from kvcore.defaults import DEFAULT_GROUP_SIZE
from kvcore.quant.affine import Affine
from kvcore.quant.base import QuantScheme
from kvcore.quant.mxfp4 import Mxfp4
from kvcore.quant.mxfp8 import Mxfp8
from kvcore.quant.nvfp4 import Nvfp4

#: The inner packings by `packing` code: MLX's own formats, each genuine under the rotation.
PACKINGS: tuple[type[QuantScheme], ...] = (Affine, Mxfp4, Nvfp4, Mxfp8)

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
        "seeded randomized Hadamard rotation of head_dim, then affine, mxfp4, nvfp4 or mxfp8 — QuaRot, Ashkboos et "
        "al. 2024, arXiv 2404.00456; RotateKV, Su et al. 2025, arXiv 2501.16383"
    )
    group_size: int = param(
        DEFAULT_GROUP_SIZE, "elements of rotated head_dim sharing one scale", minimum=16, maximum=128
    )
    seed: int = param(0, "seed of the rotation's random signs (regenerates it: no stored bytes)", minimum=0)
    packing: int = param(
        0,
        "how the rotated rows are packed: 0 affine, 1 mxfp4, 2 nvfp4, 3 mxfp8",
        choices=tuple(p.name for p in PACKINGS),
    )

    def __post_init__(self) -> None:
        """The packing checked first; a format with one group size (mxfp4 32, nvfp4 16) fixes `group_size`."""
        for p in self.parameters():
            if p.name == "packing":
                p.check(self.name, self.packing)
        groups = PACKINGS[self.packing].allowed_group_sizes
        if len(groups) == 1:
            object.__setattr__(self, "group_size", groups[0])
        super().__post_init__()

    @property
    def inner(self) -> type[QuantScheme]:
        """The packing's scheme class."""
        return PACKINGS[self.packing]

    @property
    def mode(self) -> str:  # type: ignore[override]
        return self.inner.mode

    @property
    def has_biases(self) -> bool:  # type: ignore[override]
        return self.inner.has_biases

    @property
    def allowed_bits(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.inner.allowed_bits

    @property
    def allowed_group_sizes(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.inner.allowed_group_sizes

    @property
    def packer(self) -> str:
        return f"rotated with packing {self.inner.name}"

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
        """The packing's parts (codes, scales (, biases)) of the rotated rows x·R."""
        return super().pack(self.rotate(x), bits)

    def unpack(self, parts: tuple[mx.array, ...], bits: int) -> mx.array:
        """The float rows, rotated back: dequantize(parts)·Rᵀ (float32 after an MX format's bfloat16, which holds
        the codes exactly but not their rotation)."""
        x = super().unpack(parts, bits)
        return self.unrotate(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x)
