"""Checking stored parts read from a file against the widths and dtypes a scheme packs, in one line."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx


def parts_refusal(
    parts: Sequence[mx.array], want: Sequence[tuple[int, mx.Dtype]], names: Sequence[str]
) -> str | None:
    """Why `parts` [..., width] are not the (width, dtype) of `want`, part by part, or None."""
    if len(parts) != len(want):
        return f"has {len(parts)} parts, expected {len(want)} ({', '.join(names)})"
    for part, (width, dtype), name in zip(parts, want, names, strict=True):
        if part.dtype != dtype or part.shape[-1] != width:
            return f"{name} is {part.dtype} of width {part.shape[-1]}, expected {dtype} of width {width}"
    return None


def affine_widths(head_dim: int, bits: int, group_size: int, dtype: mx.Dtype) -> list[tuple[int, mx.Dtype]]:
    """mx.quantize affine's parts of a row head_dim wide: uint32 codes, float scales and biases per group."""
    return [
        (head_dim * bits // 32, mx.uint32),
        (head_dim // group_size, dtype),
        (head_dim // group_size, dtype),
    ]
