"""Shared pieces of the benchmarks: real-config models with random weights, synthetic caches, timing, rows.

Cost depends on shape, not on weight values, so models are mlx-lm's own classes built in memory from the real
configs with random weights (no download, no disk write). On this CPU they run in float32: MLX's CPU backend has
BLAS only for float32 — a [512x2048]·[2048x8192] matmul runs at ~115 GFLOP/s in float32 and ~3 in bf16/fp16 —
so a bf16 1B model would need ~8 minutes for a 512-token prefill. Cache-only paths (recompress, bytes) use bf16.
"""

from __future__ import annotations

import importlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)

# isort: split
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

ROOT = Path(__file__).resolve().parent.parent
DEMO_CONFIG = ROOT / "resources" / "models" / "kvlens-demo" / "config.json"
SHRUNK_VOCAB = 32000

CONFIGS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-3.2-1B: vocab 128256 shrunk to 32000 (only the embedding/lm_head size changes).
    "llama-3.2-1b": dict(
        model_type="llama",
        hidden_size=2048,
        num_hidden_layers=16,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        vocab_size=SHRUNK_VOCAB,
    ),
    # Qwen/Qwen3-0.6B: vocab 151936 shrunk to 32000.
    "qwen3-0.6b": dict(
        model_type="qwen3",
        hidden_size=1024,
        num_hidden_layers=28,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        vocab_size=SHRUNK_VOCAB,
    ),
}


def model_names() -> list[str]:
    """The real configs, plus the demo model's config when it exists."""
    return [*CONFIGS, *(["kvlens-demo"] if DEMO_CONFIG.exists() else [])]


def config(name: str) -> dict[str, Any]:
    if name == "kvlens-demo":
        return json.loads(DEMO_CONFIG.read_text())
    return dict(CONFIGS[name])


def build(name: str, n_layers: int | None = None, dtype: mx.Dtype = mx.float32, seed: int = 0) -> nn.Module:
    """mlx-lm's model class for `name` with random weights; `n_layers` keeps the first layers of the real shape."""
    cfg = config(name)
    if n_layers is not None:
        cfg["num_hidden_layers"] = min(n_layers, cfg["num_hidden_layers"])
    module = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(cfg))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def shape_of(model: nn.Module) -> tuple[int, int, int]:
    """(layers, kv-heads, head_dim) of a built model."""
    args = model.args
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    return len(model.layers), args.num_key_value_heads, head_dim


def synthetic_cache(
    n_layers: int, n_kv_heads: int, head_dim: int, T: int, dtype: mx.Dtype, seed: int = 0
) -> list[KVCache]:
    """Dense mlx-lm KVCache layers holding T random rows (capacity rounded up to 256, as mlx-lm grows it).

    Decode and recompress cost depend on the cache's shape, not its values, so long contexts need no prefill.
    """
    mx.random.seed(seed)
    capacity = -(-T // KVCache.step) * KVCache.step
    out = []
    for _ in range(n_layers):
        c = KVCache()
        c.keys = mx.random.normal((1, n_kv_heads, capacity, head_dim)).astype(dtype)
        c.values = mx.random.normal((1, n_kv_heads, capacity, head_dim)).astype(dtype)
        c.offset = T
        out.append(c)
    mx.eval([a for c in out for a in (c.keys, c.values)])
    return out


def best_ms(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """Fastest wall time of `fn()` in ms: interference from other processes only ever adds time."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def median_ms(cases: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median wall time of each case in ms: two warm-ups each, then rounds interleaved over the cases."""
    for fn in cases.values():
        for _ in range(2):
            mx.eval(fn())
    times: dict[str, list[float]] = {c: [] for c in cases}
    for _ in range(rounds):
        for case, fn in cases.items():
            mx.synchronize()
            start = time.perf_counter()
            mx.eval(fn())
            mx.synchronize()
            times[case].append((time.perf_counter() - start) * 1e3)
    return {c: statistics.median(v) for c, v in times.items()}


def peak_mb_of(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run fn with MLX's peak-memory counter reset first; return its result and the peak in MiB."""
    mx.clear_cache()
    mx.reset_peak_memory()
    out = fn()
    return out, mx.get_peak_memory() / 2**20


@dataclass
class Row:
    """One measured figure, with its baseline and target where it has one."""

    bench: str
    case: str
    model: str = ""
    context: int = 0
    layers: int = 0
    value: float = float("nan")
    unit: str = ""
    baseline: float = float("nan")  # the figure it is compared with, same unit
    ratio: float = float("nan")  # value / baseline, or as the target defines it
    target: str = ""
    ok: str = ""  # "yes", "NO", or "" without a target
    peak_mb: float = float("nan")
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def csv(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        d.update(self.extra)
        return d


def judge(row: Row, ratio: float, minimum: float | None = None, maximum: float | None = None) -> Row:
    """Fill ratio/ok from a target bound."""
    row.ratio = ratio
    ok = (minimum is None or ratio >= minimum) and (maximum is None or ratio <= maximum)
    row.ok = "yes" if ok else "NO"
    return row
