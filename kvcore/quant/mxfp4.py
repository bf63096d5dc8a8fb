"""MXFP4 (OCP Microscaling): 4-bit E2M1 floats, one power-of-two (E8M0) scale per block of 32.

The OCP MX format (Rouhani et al. 2023), mx.quantize mode "mxfp4": codes 4 bits, one byte of scale per 32
elements, no bias. Attention runs on the packed form (mx.quantized_matmul).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvcore.declared import param
from kvcore.quant.base import QuantScheme


@dataclass(frozen=True)
class Mxfp4(QuantScheme):
    name: ClassVar[str] = "mxfp4"
    description: ClassVar[str] = "4-bit E2M1 floats, an E8M0 scale per 32 (OCP MX)"
    allowed_bits: ClassVar[tuple[int, ...]] = (4,)
    allowed_group_sizes: ClassVar[tuple[int, ...]] = (32,)
    mode: ClassVar[str] = "mxfp4"

    group_size: int = param(
        32, "elements sharing one E8M0 scale (fixed by the format)", minimum=32, maximum=32
    )
