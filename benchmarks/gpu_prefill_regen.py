"""gpu_bench sections d and e: prefill with capture against mlx-lm's plain prefill, regenerate against generate_step.

d. The same T random tokens prefilled (fresh cache each time) by mlx-lm's own loop (`generate_step`'s: chunks of
   2048, `mx.eval` of the cache state and `mx.clear_cache` per chunk, then the last token alone) and by
   `prefill_with_capture` exactly as `Session.prefill` calls it (capture window 256, `hold_last`, h2o "auto",
   which is eager with kvcore's h2o kernels on CUDA (kvcore.capture.h2o_mode), "eager", "eager" with the h2o kernels
   before their pipelined version (`benchmarks/h2o_sums_before.py`) and "lazy" beside it; MLX's operations alone,
   the kernels switched off, took 11.9× the plain prefill at 32k and are left out for the device time): wall time
   and peak memory per case; capture's extra memory is its peak minus the plain prefill's, over the dense cache's
   bytes; `held_mib` is what stays allocated while the result is kept (the cache included), `held_over_dense` its
   part beyond the plain prefill's, over the cache. A floor row adds to the plain prefill's median the time of one
   causal QKᵀ pass of every layer at the backend's GEMM rate measured in the same run: no capture with exact h2o
   sums can be faster (they need every normalised probability, which the fused attention does not hand out).
e. A Session (no tokenizer: token ids in) prefilled with T tokens and a 32-token dense continuation, compressed to
   25 % per-head snapkv; `Session.regenerate` (teacher-forced pass + free continuation of n tokens) against
   `mlx_lm.generate_step` producing n tokens from a copy of the same compressed cache.
Rounds are interleaved over the cases; medians are reported.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import h2o_sums_before
from benchmarks.bench_decode import attention_for
from benchmarks.common import Row, median_ms
from kvcore.cache import sparse as caches
from kvcore.capture.prefill import prefill_with_capture
from kvcore.defaults import CAPTURE_WINDOW, DEFAULT_H2O_CAPTURE
from kvcore.engine.session import CompressionConfig, Session
from kvcore.model import attention
from kvcore.model.loading import ModelInfo

# isort: split
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

CHUNK = 2048  # mlx-lm's prefill_step_size and kvcore's capture chunk


def _mib(n: float) -> float:
    return n / 2**20


def _timed(fn: Callable[[], Any]) -> tuple[float, float, float, Any]:
    """(seconds, peak MiB, MiB above what was resident, result) of fn()."""
    mx.clear_cache()
    mx.synchronize()
    resident = mx.get_active_memory()
    mx.reset_peak_memory()
    start = time.perf_counter()
    out = fn()
    mx.synchronize()
    seconds = time.perf_counter() - start
    peak = mx.get_peak_memory()
    return seconds, _mib(peak), _mib(max(0, peak - resident)), out


def plain_prefill(model: Any, ids: list[int]) -> list[Any]:
    """mlx-lm's prefill loop of `generate_step`: T - 1 tokens in chunks, then the last token's step."""
    cache = make_prompt_cache(model)
    body = ids[:-1]
    for a in range(0, len(body), CHUNK):
        model(mx.array([body[a : a + CHUNK]]), cache=cache)
        mx.eval([c.state for c in cache])
        mx.clear_cache()
    mx.eval(model(mx.array([ids[-1:]]), cache=cache))
    return cache


def gemm_tflops(dtype: Any, rounds: int = 5) -> tuple[float, int]:
    """(TFLOP/s, n) of the backend's n³ matrix product in `dtype`, median of rounds: the rate no QKᵀ pass can beat
    (8192 on a GPU; 1024 elsewhere, a smoke run)."""
    n = 8192 if mx.default_device() == mx.gpu else 1024
    a, b = (mx.random.normal((n, n), key=mx.random.key(i)).astype(dtype) for i in (1, 2))
    mx.eval(a, b)
    ms = median_ms({"matmul": lambda: a @ b}, rounds)["matmul"]
    return 2 * n**3 / (ms * 1e-3) / 1e12, n


def floor_row(model: Any, name: str, T: int, plain_s: float) -> Row:
    """The least time any capture with exact h2o sums can take: the plain prefill plus one more causal QKᵀ pass (the
    column sums need every normalised probability, which the attention does not hand out) at the measured GEMM rate,
    with its log-sum-exp, exps, masks and sums for free."""
    args = model.args
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    flops = len(model.layers) * args.num_attention_heads * head_dim * T * (T + 1)  # 2·D per causal score
    tflops, n = gemm_tflops(model.layers[0].self_attn.q_proj.weight.dtype)
    floor = plain_s + flops / (tflops * 1e12)
    row = Row(bench="prefill", case="floor for exact h2o sums: plain + one causal QK^T pass at the GEMM rate",
              model=name, context=T, layers=len(model.layers), value=floor, unit="s", baseline=plain_s,
              ratio=floor / plain_s, target="<= 1.10x plain prefill")  # fmt: skip
    row.ok = "yes" if row.ratio <= 1.10 else "NO"
    row.extra = {"x_plain_prefill": round(row.ratio, 3), "qk_flop": f"{flops:.4g}",
                 "gemm_tflops": round(tflops, 3)}  # fmt: skip
    row.note = (f"{flops:.3g} FLOP of causal scores at {tflops * 1e12:.3g} FLOP/s ({n}^3 product, same dtype, "
                f"this run); lse, exp, mask and sums counted as free")  # fmt: skip
    print(f"  prefill T={T} floor: {floor:.3f} s = {row.ratio:.3f}x plain ({row.note})", flush=True)
    return row


def prefill_rows(model: Any, name: str, T: int, rounds: int) -> list[Row]:
    ids = np.random.default_rng(T).integers(0, model.args.vocab_size, T).tolist()
    n_layers = len(model.layers)

    def capture(h2o: str, before: bool = False) -> Callable[[], Any]:
        def run() -> Any:
            with h2o_sums_before.swapped() if before else contextlib.nullcontext():
                return prefill_with_capture(model, ids, window=CAPTURE_WINDOW, chunk_size=CHUNK, h2o=h2o,
                                            hold_last=True)  # fmt: skip

        return run

    cases: dict[str, tuple[bool, Callable[[], Any]]] = {
        "mlx-lm plain prefill": (False, lambda: plain_prefill(model, ids)),
        f"kvcore capture h2o={DEFAULT_H2O_CAPTURE}": (True, capture(DEFAULT_H2O_CAPTURE)),
        "kvcore capture h2o=eager": (True, capture("eager")),
        "kvcore capture h2o=eager, kernels before": (True, capture("eager", before=True)),
        "kvcore capture h2o=lazy": (True, capture("lazy")),
    }
    secs: dict[str, list[float]] = {c: [] for c in cases}
    peak: dict[str, float] = {}
    extra: dict[str, float] = {}
    held: dict[str, float] = {}
    mode: dict[str, str] = {}
    dense_bytes = 0
    for _ in range(rounds):
        for case, (kv_side, fn) in cases.items():
            mx.clear_cache()
            before = mx.get_active_memory()
            with attention_for(model, kv_side):
                s, p, e, out = _timed(fn)
            mx.clear_cache()
            held[case] = max(held.get(case, 0.0), _mib(mx.get_active_memory() - before))
            secs[case].append(s)
            peak[case], extra[case] = max(peak.get(case, 0.0), p), max(extra.get(case, 0.0), e)
            if hasattr(out, "h2o_mode"):
                mode[case] = out.h2o_mode
                dense_bytes = caches.cache_tensor_bytes(out.cache)
            del out
        print(
            f"  prefill T={T} round: " + ", ".join(f"{c} {v[-1]:.2f} s" for c, v in secs.items()), flush=True
        )
    med = {c: statistics.median(v) for c, v in secs.items()}
    base = "mlx-lm plain prefill"
    rows = []
    for case in cases:
        row = Row(bench="prefill", case=case, model=name, context=T, layers=n_layers, value=med[case], unit="s",
                  peak_mb=peak[case])  # fmt: skip
        row.extra = {"extra_mib": round(extra[case], 1), "dense_cache_mib": round(_mib(dense_bytes), 1),
                     "held_mib": round(held[case], 1), "rounds_s": "/".join(f"{v:.3f}" for v in secs[case])}  # fmt: skip
        if case != base:
            over = (peak[case] - peak[base]) / max(_mib(dense_bytes), 1e-9)
            row.baseline, row.ratio = med[base], med[case] / med[base]
            row.target = "<= 1.10x plain prefill; extra memory <= 0.15x dense cache"
            row.ok = "yes" if row.ratio <= 1.10 and over <= 0.15 else "NO"
            row.extra["x_plain_prefill"] = round(row.ratio, 3)
            row.extra["extra_over_dense"] = round(over, 3)
            kept = (held[case] - held[base]) / max(_mib(dense_bytes), 1e-9)
            row.extra["held_over_dense"] = round(kept, 3)
            row.note = f"h2o {mode.get(case, '?')}; peak - plain peak = {over:.3f}x, held - plain = {kept:.3f}x dense"
        rows.append(row)
    rows.append(floor_row(model, name, T, med[base]))
    mx.clear_cache()
    return rows


def _session(model: Any, name: str, ids: list[int], n_tokens: int) -> Session:
    args = model.args
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    info = ModelInfo(name, "", args.model_type, len(model.layers), args.num_attention_heads,
                     args.num_key_value_heads, head_dim, None, args.vocab_size)  # fmt: skip
    s = Session(model, None, info)
    s.prefill(ids, n_tokens=n_tokens)
    return s


def _float32_logits(tokens: mx.array, logits: mx.array) -> mx.array:
    """For the token check only: generate_step takes the argmax of log-probabilities computed in the model's dtype,
    and in bf16 `logits - logsumexp` merges logits one ulp apart, so it can pick another of two near-tied tokens
    than the argmax of the logits that Session takes; in float32 both pick the same token."""
    return logits.astype(mx.float32)


def regenerate_rows(model: Any, name: str, T: int, n_tokens: int, rounds: int) -> list[Row]:
    ids = np.random.default_rng(T + 1).integers(0, model.args.vocab_size, T).tolist()
    session = _session(model, name, ids, n_tokens)
    state = session.compress(CompressionConfig("snapkv", 0.25))
    first = session.dense_tokens[0]

    def mlx_lm_generate(logits_processors: list | None = None) -> list[int]:
        cache = caches.copy_cache(state.cache)
        out = [
            first
        ]  # fed first, as regenerate's "paper" continuation is; n forward steps (regenerate: n - 1)
        for tok, _ in generate_step(
            mx.array([first]),
            model,
            prompt_cache=cache,
            max_tokens=n_tokens,
            logits_processors=logits_processors,
        ):
            out.append(int(tok))
        return out[:n_tokens]

    cases: dict[str, Callable[[], Any]] = {
        f"mlx-lm generate_step {n_tokens} tokens": mlx_lm_generate,
        f"Session.regenerate {n_tokens} tokens": lambda: session.regenerate(state, n_tokens),
    }
    secs: dict[str, list[float]] = {c: [] for c in cases}
    attention.install(model)  # both run kvcore's sparse cache
    same = True
    for _ in range(rounds):
        results = {}
        for case, fn in cases.items():
            s, _, _, results[case] = _timed(fn)
            secs[case].append(s)
        _, b = results.values()
        same = same and b.tokens == mlx_lm_generate([_float32_logits])
        print(f"  regenerate T={T} round: " + ", ".join(f"{c} {v[-1] * 1e3:.0f} ms" for c, v in secs.items()),
              flush=True)  # fmt: skip
    attention.uninstall(model)
    med = {c: statistics.median(v) * 1e3 for c, v in secs.items()}
    base, regen = cases
    rows = []
    for case in cases:
        row = Row(bench="regenerate", case=case, model=name, context=T, layers=len(model.layers),
                  value=med[case], unit="ms")  # fmt: skip
        row.extra = {"rounds_ms": "/".join(f"{v * 1e3:.1f}" for v in secs[case])}
        if case == regen:
            row.baseline, row.ratio = med[base], med[case] / med[base]
            row.target = "<= 1.15x generate_step"
            row.ok = "yes" if row.ratio <= 1.15 else "NO"
            row.extra["x_generate_step"] = round(row.ratio, 3)
            row.note = f"25% per-head snapkv; same tokens as generate_step (float32 log-probabilities): {'yes' if same else 'NO'}"
        rows.append(row)
    mx.clear_cache()
    return rows
