"""The one small protocol every quantization scheme follows: how it packs one side (keys or values) of a cache.

A scheme is a frozen dataclass, as a method is (`kvcore.methods.base`): its fields are its parameters, declared with
`kvcore.declared.param`, so the GUI, the CLI, session files and the CSVs read the declaration. It packs rows along
their last axis (head_dim) into stored parts, unpacks them, and says which widths and groups it takes. `genuine` schemes attend on the packed form (mx.quantized_matmul in the scheme's `mode`,
`kvcore.model.attention`); the others attend on a dequantized copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import mlx.core as mx
import numpy as np

from kvcore.declared import Parameter, declared_parameters, param
from kvcore.defaults import DEFAULT_GROUP_SIZE


@dataclass(frozen=True)
class QuantScheme:
    """Base scheme. Subclasses set `name`, `description` and the allowed widths and groups, and declare
    `group_size` (and any other parameter) with `param`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: Attention runs on the packed form (True), or on a dequantized copy (False: "simulated").
    genuine: ClassVar[bool] = True
    allowed_bits: ClassVar[tuple[int, ...]] = ()
    allowed_group_sizes: ClassVar[tuple[int, ...]] = ()
    #: The `mode` of mx.quantize / mx.dequantize / mx.quantized_matmul this scheme packs with.
    mode: ClassVar[str] = "affine"
    #: Stored parts of a packed side: codes and scales, and a bias per group where the scheme has one (affine).
    has_biases: ClassVar[bool] = False
    #: Keys packed per channel, in groups along tokens (KIVI): the cache is `kvcore.cache.kivi.KiviKVCache`.
    per_channel_keys: ClassVar[bool] = False

    group_size: int = param(DEFAULT_GROUP_SIZE, "elements of head_dim sharing one scale")

    def __post_init__(self) -> None:
        for p in self.parameters():
            if p.name != "group_size":
                p.check(self.name, getattr(self, p.name))
        g = self.group_size
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g not in self.allowed_group_sizes:
            raise ValueError(
                f"group_size={g!r} is not supported: {self.packer} allows group sizes {self.allowed_group_sizes}"
            )

    @classmethod
    def parameters(cls) -> tuple[Parameter, ...]:
        """The parameters this scheme declares."""
        return declared_parameters(cls)

    def values(self) -> dict[str, int | float]:
        """Each parameter's current value by name."""
        return {p.name: getattr(self, p.name) for p in self.parameters()}

    #: Stored parts are not mx.quantize's: a file's arrays are checked by the scheme's `layout_refusal`.
    own_layout: ClassVar[bool] = False

    @property
    def spec(self) -> str:
        """The name with every parameter not at its default but group_size (which the caches carry on their own):
        "affine", "rotated:packing=mxfp4" — what `kvcore.quant.get` rebuilds this scheme from."""
        changed = [
            f"{p.name}={p.choices[v] if p.choices else v}"
            for p in self.parameters()
            if p.name != "group_size" and (v := getattr(self, p.name)) != p.default
        ]
        return f"{self.name}:{','.join(changed)}" if changed else self.name

    @property
    def n_parts(self) -> int:
        """How many arrays a packed side stores: codes, scales (, biases)."""
        return 3 if self.has_biases else 2

    @property
    def n_value_parts(self) -> int:
        """How many arrays packed values store: as keys unless the scheme packs them otherwise (qjl)."""
        return self.n_parts

    def layout_refusal(self, parts: tuple[mx.array, ...], bits: int, values: bool = False) -> str | None:
        """Why parts read from a file are not this scheme's at `bits`, or None (for an `own_layout` scheme)."""
        return None

    @property
    def packer(self) -> str:
        """Who sets the limits, as refusals name it: mx.quantize (affine, its default mode) or one of its modes."""
        return "mx.quantize" if self.mode == "affine" else f"{self.name} (mx.quantize mode {self.mode!r})"

    @property
    def execution(self) -> str:
        """How attention runs, as the statistics and the CSVs say it: "genuine" or "simulated"."""
        return "genuine" if self.genuine else "simulated"

    def bits_refusal(self, bits: Any) -> str | None:
        """Why this scheme cannot pack at `bits`, or None."""
        if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or bits not in self.allowed_bits:
            return f"bits={bits!r} is not supported: {self.packer} allows bits in {self.allowed_bits}"
        return None

    def check(self, bits: Any, head_dim: int | None = None) -> None:
        """One-line ValueError naming what is allowed when this scheme cannot pack rows `head_dim` wide at `bits`."""
        refusal = self.bits_refusal(bits)
        if refusal is not None:
            raise ValueError(refusal)
        if head_dim is not None and head_dim % self.group_size:
            allowed = [g for g in self.allowed_group_sizes if head_dim % g == 0]
            raise ValueError(
                f"group_size={self.group_size} does not divide head_dim={head_dim}: quantization groups run along "
                f"head_dim, so use one of {allowed or f'none ({self.name} cannot pack this head_dim)'}"
            )

    def pack(self, x: mx.array, bits: int) -> tuple[mx.array, ...]:
        """The stored parts of rows `x` [..., head_dim]: codes, then scales (and biases where the scheme has them)."""
        return tuple(mx.quantize(x, group_size=self.group_size, bits=bits, mode=self.mode))

    def pack_values(self, x: mx.array, bits: int) -> tuple[mx.array, ...]:
        """The stored parts of value rows: as keys' unless the scheme packs the two sides differently (qjl)."""
        return self.pack(x, bits)

    def unpack(self, parts: tuple[mx.array, ...], bits: int) -> mx.array:
        """The float rows the stored parts hold (MLX's MX modes give bfloat16, which holds their values exactly)."""
        return mx.dequantize(*parts, group_size=self.group_size, bits=bits, mode=self.mode)
