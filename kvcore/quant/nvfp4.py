"""NVFP4: 4-bit E2M1 floats, one FP8 (E4M3) scale per block of 16.

NVIDIA's Blackwell format, mx.quantize mode "nvfp4": codes 4 bits, one byte of scale per 16 elements, no bias.
Finer blocks and a mantissa in the scale, against MXFP4. Attention runs on the packed form (mx.quantized_matmul).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvcore.declared import param
from kvcore.quant.base import QuantScheme


@dataclass(frozen=True)
class Nvfp4(QuantScheme):
    name: ClassVar[str] = "nvfp4"
    description: ClassVar[str] = "4-bit E2M1 floats, an E4M3 scale per 16 (NVIDIA)"
    allowed_bits: ClassVar[tuple[int, ...]] = (4,)
    allowed_group_sizes: ClassVar[tuple[int, ...]] = (16,)
    mode: ClassVar[str] = "nvfp4"

    group_size: int = param(
        16, "elements sharing one E4M3 scale (fixed by the format)", minimum=16, maximum=16
    )
