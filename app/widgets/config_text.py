"""A configuration in words and back: the label every view shows and the bit widths a grid field accepts.

Pure text over plain dicts (no Qt), kept apart so widgets and controllers share one definition without one
importing the other.
"""

from __future__ import annotations

from typing import Any

from kvcore.defaults import ALLOWED_BITS, DEFAULT_QUANT, UNQUANTIZED_BITS


def config_label(config: dict[str, Any]) -> str:
    """A configuration in a few words, e.g. 'snapkv 25 % · 4-bit g64' (affine) or 'snapkv 25 % · 4-bit mxfp4 g32'."""
    bits = config.get("bits") or UNQUANTIZED_BITS
    value_bits = config.get("value_bits") or bits
    quant = f"{bits}-bit" if bits == UNQUANTIZED_BITS else f"{bits}-bit g{config.get('group_size')}"
    if value_bits != bits:
        quant = f"K{bits}/V{value_bits}-bit g{config.get('group_size')}"
    scheme = config.get("quant") or DEFAULT_QUANT
    if scheme != DEFAULT_QUANT and (bits, value_bits) != (UNQUANTIZED_BITS,) * 2:
        quant = quant.replace("-bit g", f"-bit {scheme} g")
    if config.get("fp_recent"):
        quant += f" fp{config['fp_recent']}"
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
