"""A decoding run measured against the dense continuation the prefill computed (once: every policy, every sweep
point, reads the same `Session.dense_tokens`, nothing dense is decoded again)."""

from __future__ import annotations

from typing import Any

from kvcore.engine.decoding import DecodingRun
from kvcore.measure.metrics import first_divergence

__all__ = ["DECODE_COLUMNS", "decode_summary"]

#: The summary of one decoding run (the `kvlens compress --decode-*` JSON keys and `kvlens sweep`'s decode columns).
DECODE_COLUMNS: tuple[str, ...] = (
    "decode_method",
    "decode_budget",
    "decode_ratio",
    "decode_interval",
    "decode_threshold",
    "decode_tokens",
    "decode_interrupted",
    "decode_compressions",
    "max_cache_tokens",
    "decode_bytes_min",
    "decode_bytes_max",
    "decode_bytes_last",
    "decode_agreement",
    "decode_first_divergence",
    "decode_evict_ms",
)


def decode_summary(session: Any, run: DecodingRun) -> dict[str, Any]:
    """DECODE_COLUMNS of `run`: its policy, cache size and bytes, and top-1 agreement / first divergence against
    the session's dense continuation (as many tokens as both have)."""
    policy = run.policy
    dense = session.dense_tokens[: len(run.tokens)]
    same = sum(a == b for a, b in zip(dense, run.tokens, strict=False))
    size = run.bytes_summary()
    return {
        "decode_method": policy.method,
        "decode_budget": policy.budget,
        "decode_ratio": policy.ratio,
        "decode_interval": policy.interval,
        "decode_threshold": policy.threshold,
        "decode_tokens": len(run.tokens),
        "decode_interrupted": run.interrupted,
        "decode_compressions": len(run.compressions),
        "max_cache_tokens": run.max_cache_tokens,
        "decode_bytes_min": size["min"],
        "decode_bytes_max": size["max"],
        "decode_bytes_last": size["last"],
        "decode_agreement": same / len(dense) if dense else float("nan"),
        "decode_first_divergence": first_divergence(dense, run.tokens),
        "decode_evict_ms": run.evict_seconds * 1e3,
    }
