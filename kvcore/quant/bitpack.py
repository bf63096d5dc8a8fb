"""b-bit codes really packed: a little-endian bit stream per row, eight bits to a uint8.

TurboQuant's codes and QJL's sign bits take any width from 1 bit up, which mx.quantize's packing does not offer
for codes that are not its own; so they are packed here, and the stored bytes are d·b/8 per row, no more.
"""

from __future__ import annotations

import mlx.core as mx


def packed_width(n: int, bits: int) -> int:
    """Bytes per row of n codes at `bits` (n·bits must be whole bytes)."""
    if (n * bits) % 8:
        raise ValueError(
            f"{n} codes of {bits} bits are not whole bytes: the row width must make n·bits a multiple of 8"
        )
    return n * bits // 8


def pack_bits(codes: mx.array, bits: int) -> mx.array:
    """codes [..., n] (values < 2^bits) -> uint8 [..., n·bits/8]: code j's bit i is stream bit j·bits + i."""
    n = codes.shape[-1]
    width = packed_width(n, bits)
    c = codes.astype(mx.uint8)
    stream = mx.right_shift(mx.expand_dims(c, -1), mx.arange(bits, dtype=mx.uint8)) & 1
    stream = stream.reshape(*codes.shape[:-1], width, 8)
    return mx.sum(mx.left_shift(stream, mx.arange(8, dtype=mx.uint8)), axis=-1).astype(mx.uint8)


def unpack_bits(packed: mx.array, bits: int) -> mx.array:
    """uint8 [..., w] -> codes uint8 [..., w·8/bits]: undoes `pack_bits`."""
    w = packed.shape[-1]
    stream = mx.right_shift(mx.expand_dims(packed, -1), mx.arange(8, dtype=mx.uint8)) & 1
    stream = stream.reshape(*packed.shape[:-1], w * 8 // bits, bits)
    return mx.sum(mx.left_shift(stream, mx.arange(bits, dtype=mx.uint8)), axis=-1).astype(mx.uint8)
