"""A configuration in words and back: the label every view shows and the bit widths a grid field accepts.

Pure text over plain dicts (no Qt), kept apart so widgets and controllers share one definition without one
importing the other.
"""

from __future__ import annotations

from typing import Any

from kvcore.defaults import ALLOWED_BITS, DEFAULT_QUANT, UNQUANTIZED_BITS


def config_label(config: dict[str, Any], baseline: str | None = None) -> str:
    """A configuration in a few words, e.g. 'snapkv 25 % · 4-bit g64' (affine) or 'snapkv 25 % · 4-bit mxfp4 g32',
    'snapkv 25 % · 4-bit g64 edges 2@8' (the first and last 2 layers at 8 bits).

    `baseline` is the dense cache's element type (ModelInfo.cache_dtype): given, an unquantized side is named by
    it ('snapkv 25 % · float32', 'K8/V float32 g64'), since "16-bit" would hide a float32 cache on MLX's CPU.
    """
    bits = config.get("bits") or UNQUANTIZED_BITS
    value_bits = config.get("value_bits") or bits
    group = f" g{config.get('group_size')}"
    scheme = config.get("quant") or DEFAULT_QUANT
    named = f" {scheme}" if scheme != DEFAULT_QUANT else ""
    if (bits, value_bits) == (UNQUANTIZED_BITS,) * 2:
        quant = baseline or f"{bits}-bit"
    elif value_bits == bits:
        quant = f"{bits}-bit{named}{group}"
    elif baseline and UNQUANTIZED_BITS in (bits, value_bits):
        keys = f" {baseline}" if bits == UNQUANTIZED_BITS else str(bits)
        values = f" {baseline}" if value_bits == UNQUANTIZED_BITS else f"{value_bits}-bit"
        quant = f"K{keys}/V{values}{named}{group}"
    else:
        quant = f"K{bits}/V{value_bits}-bit{named}{group}"
    if config.get("fp_recent"):
        quant += f" fp{config['fp_recent']}"
    if config.get("layer_bits"):
        quant += f" layers {','.join(map(str, config['layer_bits']))}"
    elif config.get("edge_layers"):
        quant += f" edges {config['edge_layers']}@{config.get('edge_bits')}"
    shared = "" if config.get("per_head", True) else " · shared"
    return f"{config['method']} {100 * config['ratio']:.0f} % · {quant}{shared}"


def parse_bits(text: str) -> list[int]:
    """Bit widths from "4,8,16" (16 = unquantized); ValueError with the allowed values otherwise."""
    allowed = (*ALLOWED_BITS, UNQUANTIZED_BITS)
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"bits {text!r}: expected comma-separated whole numbers such as 4,8,16") from None
    if not values:
        raise ValueError("no bit widths given: write e.g. 16 (unquantized) or 4,8,16")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(
            f"bits {bad[0]} is not possible: choose from {', '.join(map(str, allowed))} (16 = none)"
        )
    return list(dict.fromkeys(values))
