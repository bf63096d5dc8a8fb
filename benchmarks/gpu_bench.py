"""GPU figures (MLX CUDA backend, or Metal): recompress, decode, prefill with capture, regenerate, peak memory.

    PYTHONUNBUFFERED=1 python -m benchmarks.gpu_bench --out DIR       # Llama-3.1-8B bf16, 8k and 32k (a GPU)
    python -m benchmarks.gpu_bench --out DIR --small                  # the same rows, small shapes: a CPU smoke run

One run measures side by side, on the default device (a GPU):
  a. recompress on a dense 32-layer bf16 cache (H_kv 8, head_dim 128) at 8k and 32k: `kvcore.select_positions`
     at 25 % with per-head 2-D indices, with ragged AdaKV lists (as numpy arrays and as Python lists), slicing
     the cached knorm ranking + gather (validated), 4-bit `quantize_cache` of the dense cache, the 25 % gather of
     the 4-bit packed cache — against one plain copy of the cache (`mx.array` of every layer's K and V + eval)
     and `copy_cache` (copy-on-write: no bytes move); also trusted indices (`validate=False`, Session's slider
     path) and the per-layer path of before issue 15 (`benchmarks.select_positions_before`). Every case is warmed
     up twice, then `--repeats` rounds interleave the cases; median per case.
  b. decode tok/s at 8k and 32k: kvcore B0 (`to_sparse_all`, kvcore attention installed) against mlx-lm's
     `KVCache`, 25 % retention (2-D and AdaKV ragged; ragged also with kvcore's CUDA kernels switched off, the
     masked MLX fallback), and 4-bit `quantize_cache` against mlx-lm's
     `QuantizedKVCache` 4-bit — the greedy loop of `benchmarks.bench_decode.decode` (model, argmax, `mx.eval`
     per token), rounds interleaved, median over rounds. A case whose kernel the backend lacks (MLX 0.32.4 CUDA
     has no `quantized_matmul` for the quantized attention's shape) is reported as FAILED, and the run goes on.
  c. peak memory per case (`mx.reset_peak_memory` before it): the total peak and the part above what was resident.
  d, e. prefill with capture against mlx-lm's plain prefill, and Session.regenerate against generate_step
     (`benchmarks.gpu_prefill_regen`).

The model is mlx-lm's `llama.Model` with random weights and the real Llama-3.1-8B config (full vocabulary 128256,
llama3 RoPE scaling); decode caches are synthetic (random K/V in a `KVCache` of the right length), as in the CPU
benchmarks. Rows are printed as a table and written to DIR/gpu_results.csv after every section.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common, gpu_prefill_regen, select_positions_before
from benchmarks.bench_decode import attention_for, decode
from benchmarks.common import Row, synthetic_cache
from kvcore import kernels
from kvcore.cache import sparse as caches
from kvcore.capture.prefill import LayerObservation
from kvcore.methods.selection import device_select, rank, select

# isort: split
import mlx.core as mx

NAME = "llama-3.1-8b"
# meta-llama/Llama-3.1-8B config.json (vocabulary kept at its real size: memory is no concern on the GPU).
common.CONFIGS.setdefault(
    NAME,
    dict(
        model_type="llama",
        hidden_size=4096,
        num_hidden_layers=32,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=dict(
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
            rope_type="llama3",
        ),
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        vocab_size=128256,
    ),
)
SMALL = NAME + " (small)"
# --small: the 8B head layout (32 q / 8 kv heads of 128) in 4 thin layers with a 32k vocabulary, float32 (CPU BLAS).
common.CONFIGS.setdefault(
    SMALL,
    dict(
        common.CONFIGS[NAME], hidden_size=512, intermediate_size=1024, num_hidden_layers=4, vocab_size=32000
    ),
)
LAYERS, H_Q, H_KV, HEAD_DIM = 32, 32, 8, 128
RATIO = 0.25
# The masked MLX fallback, beside the ragged kernel.
RAGGED_OPS = "kvcore 25% kept (AdaKV ragged, kernels off)"

# The seed's figures on this device (DESIGN.md), for the comparison column.
SEED = {
    ("select 25% per-head 2-D", 8192): 24.6,
    ("select 25% per-head 2-D", 32768): 57.0,
    ("select 25% ragged AdaKV (Python lists)", 32768): 258.0,
    ("one plain copy (mx.array of K and V)", 8192): 2.2,
    ("one plain copy (mx.array of K and V)", 32768): 5.8,
    ("kvcore B0", 32768): 51.0,
    ("mlx-lm KVCache", 32768): 72.0,
}


def _mib(n: float) -> float:
    return n / 2**20


def measure(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> tuple[float, float, float, float]:
    """(median ms, min ms, peak MiB, MiB above what was resident) of fn(), synchronized before and after."""
    for _ in range(warmup):
        fn()
        mx.synchronize()
    mx.clear_cache()
    mx.synchronize()
    resident = mx.get_active_memory()
    mx.reset_peak_memory()
    times = []
    for _ in range(repeats):
        mx.synchronize()
        start = time.perf_counter()
        out = fn()
        mx.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
        del out
    peak = mx.get_peak_memory()
    return statistics.median(times), min(times), _mib(peak), _mib(max(0, peak - resident))


def _seed_compare(row: Row, key: tuple[str, int], higher_is_better: bool) -> Row:
    seed = SEED.get(key)
    if seed is not None:
        row.baseline = seed
        row.ratio = row.value / seed
        better = row.value > seed if higher_is_better else row.value < seed
        row.target = "better than the seed (DESIGN.md)"
        row.ok = "yes" if better else "NO"
    return row


def measure_interleaved(
    cases: list[tuple[str, Callable[[], Any], str]], repeats: int
) -> dict[str, tuple[float, float, float, float]]:
    """measure() for several cases, rounds interleaved: two warm-ups each, then `repeats` rounds over all cases."""
    for _, fn, _ in cases:
        for _ in range(2):
            fn()
            mx.synchronize()
    times: dict[str, list[float]] = {c: [] for c, _, _ in cases}
    for _ in range(repeats):
        for case, fn, _ in cases:
            mx.synchronize()
            start = time.perf_counter()
            out = fn()
            mx.synchronize()
            times[case].append((time.perf_counter() - start) * 1e3)
            del out
    out = {}
    for case, fn, _ in cases:
        _, _, peak, extra = measure(fn, 1, warmup=0)
        out[case] = (statistics.median(times[case]), min(times[case]), peak, extra)
    return out


def recompress(T: int, repeats: int, n_layers: int = LAYERS, dtype: Any = None) -> list[Row]:
    """Section a at one context: every gather / pack / copy of a dense bf16 cache of the 8B's head layout."""
    dense = synthetic_cache(n_layers, H_KV, HEAD_DIM, T, dtype or mx.bfloat16)
    q = mx.zeros((H_Q, 1, HEAD_DIM))
    obs = [LayerObservation(c.keys[0, :, :T], q, None, H_Q, H_KV, HEAD_DIM**-0.5) for c in dense]
    ranking = rank(obs, "knorm")
    per_head = select(ranking, RATIO)  # [H_kv, n] per layer
    ragged = select(ranking, RATIO, adakv=True)  # H_kv arrays of different lengths per layer
    ragged_lists = [[a.tolist() for a in layer] for layer in ragged]
    counts = np.array([[len(a) for a in layer] for layer in ragged])
    dense_bytes = caches.cache_tensor_bytes(dense)

    def copy_arrays() -> list:
        out = [mx.array(x) for c in dense for x in (c.keys, c.values)]
        mx.eval(out)
        return out

    packed = caches.quantize_cache(dense, bits=4, group_size=64)
    cases: list[tuple[str, Callable[[], Any], str]] = [
        ("one plain copy (mx.array of K and V)", copy_arrays, ""),
        (
            "copy_cache (copy-on-write branch)",
            lambda: caches.copy_cache(dense),
            "no bytes move until a write",
        ),
        (
            "select 25% per-head 2-D",
            lambda: caches.select_positions(dense, per_head),
            "numpy [H_kv, n] per layer",
        ),
        (
            "select 25% per-head 2-D, trusted (Session)",
            lambda: caches.select_positions(dense, per_head, validate=False),
            "validate=False, as Session.compress",
        ),
        (
            "select 25% per-head 2-D, rows sorted on the device (Session on a GPU)",
            lambda: caches.select_positions(
                dense, per_head, validate=False, device_indices=device_select(ranking, per_head)
            ),
            "device_select from the ranking's orders (copied once): no indices uploaded",
        ),
        (
            "select 25% per-head 2-D, per-layer path before issue 15",
            lambda: select_positions_before.select_positions(dense, per_head),
            "benchmarks/select_positions_before.py",
        ),
        (
            "select 25% ragged AdaKV (numpy)",
            lambda: caches.select_positions(dense, ragged),
            f"knorm+adakv counts per head {counts.min()}..{counts.max()}",
        ),
        (
            "select 25% ragged AdaKV (Python lists)",
            lambda: caches.select_positions(dense, ragged_lists),
            "H_kv Python int lists per layer",
        ),
        (
            "select(ranking, 25%) + select_positions",
            lambda: caches.select_positions(dense, select(ranking, RATIO)),
            "slices the cached knorm ranking; validated",
        ),
        ("quantize_cache 4-bit (whole dense cache)", lambda: caches.quantize_cache(dense, 4, 64), "group 64"),
        (
            "select 25% of the 4-bit packed cache",
            lambda: caches.select_positions(packed, per_head),
            "Session's quantized path",
        ),
        (
            "select 25% + quantize_cache 4-bit",
            lambda: caches.quantize_cache(caches.select_positions(dense, per_head), 4, 64),
            "old quantized path",
        ),
    ]
    rows: list[Row] = []
    copy_ms = None
    measured = measure_interleaved(cases, repeats)
    for case, fn, note in cases:
        med, best, peak, extra = measured[case]
        out = fn()
        arrays = isinstance(out, list) and out and isinstance(out[0], mx.array)
        nbytes = sum(a.nbytes for a in out) if arrays else caches.cache_tensor_bytes(out)
        del out
        row = Row(bench="recompress", case=case, model=NAME + " (bf16 cache)", context=T, layers=n_layers,
                  value=med, unit="ms", peak_mb=peak, note=note)  # fmt: skip
        row.extra = {
            "min_ms": round(best, 3),
            "extra_mib": round(extra, 1),
            "out_bytes": nbytes,
            "dense_bytes": dense_bytes,
        }
        if copy_ms is None:
            copy_ms = med
        row.extra["x_plain_copy"] = round(med / copy_ms, 3)
        rows.append(_seed_compare(row, (case, T), higher_is_better=False))
        print(f"  recompress T={T} {case}: {med:.2f} ms (min {best:.2f}), +{extra:.0f} MiB", flush=True)
    by_case = {r.case: r for r in rows}
    before = by_case["select 25% per-head 2-D, per-layer path before issue 15"].value
    limit = 2.0 if T >= 32768 else 3.0  # issue 15's must-show: <= 2x one plain copy at 32k, <= 3x at 8k
    for case in (
        "select 25% per-head 2-D",
        "select 25% per-head 2-D, trusted (Session)",
        "select 25% per-head 2-D, rows sorted on the device (Session on a GPU)",
    ):
        row = by_case[case]
        row.extra["x_before_issue15"] = round(row.value / before, 3)
        row.extra["issue15_target"] = (
            f"<= {limit:g}x plain copy: {'yes' if row.extra['x_plain_copy'] <= limit else 'NO'}"
        )
    mx.clear_cache()
    return rows


def decode_rows(model: Any, T: int, n_tokens: int, rounds: int, name: str = NAME) -> list[Row]:
    """Section b at one context: tokens/s of every cache in the same greedy loop, rounds interleaved."""
    n_layers = len(model.layers)
    dtype = model.layers[0].self_attn.q_proj.weight.dtype
    dense = synthetic_cache(n_layers, H_KV, HEAD_DIM, T, dtype)
    obs = [LayerObservation(c.keys[0, :, :T], mx.zeros((H_Q, 1, HEAD_DIM)), None, H_Q, H_KV, HEAD_DIM**-0.5)
           for c in dense]  # fmt: skip
    ranking = rank(obs, "knorm")
    per_head, ragged = select(ranking, RATIO), select(ranking, RATIO, adakv=True)
    # (kvcore's attention installed, kvcore's CUDA kernels on, the cache)
    cases: dict[str, tuple[bool, bool, Callable[[], list]]] = {
        "mlx-lm KVCache": (False, True, lambda: caches.copy_cache(dense)),
        "kvcore B0": (True, True, lambda: caches.to_sparse_all(dense)),
        "kvcore 25% kept (per-head 2-D)": (True, True, lambda: caches.select_positions(dense, per_head)),
        "kvcore 25% kept (AdaKV ragged)": (True, True, lambda: caches.select_positions(dense, ragged)),
        RAGGED_OPS: (True, False, lambda: caches.select_positions(dense, ragged)),
        "mlx-lm QuantizedKVCache 4b": (
            False,
            True,
            lambda: [c.to_quantized(group_size=64, bits=4) for c in dense],
        ),
        "kvcore quantize_cache 4b": (True, True, lambda: caches.quantize_cache(dense, bits=4, group_size=64)),
    }
    tps: dict[str, list[float]] = {c: [] for c in cases}
    peaks: dict[str, tuple[float, float]] = {}
    nbytes: dict[str, int] = {}
    failed: dict[str, str] = {}
    for _ in range(rounds):
        for case, (kv_side, fused, factory) in cases.items():
            if case in failed:
                continue
            with attention_for(model, kv_side), kernels.switched(fused):
                mx.clear_cache()
                mx.synchronize()
                resident = mx.get_active_memory()
                mx.reset_peak_memory()
                cache = factory()
                nbytes[case] = caches.cache_tensor_bytes(cache)
                try:
                    tps[case].append(decode(model, cache, n_tokens))
                except RuntimeError as e:  # a kernel the backend lacks: report it, keep going
                    failed[case] = str(e).splitlines()[0][:160]
                    print(f"  decode T={T} {case} FAILED: {failed[case]}", flush=True)
                    continue
                finally:
                    del cache
                mx.synchronize()
                peak = mx.get_peak_memory()
            old = peaks.get(case, (0.0, 0.0))
            peaks[case] = (max(old[0], _mib(peak)), max(old[1], _mib(max(0, peak - resident))))
        print(
            f"  decode T={T} round: " + ", ".join(f"{c} {v[-1]:.1f}" for c, v in tps.items() if v), flush=True
        )
    med = {c: statistics.median(v) if v else float("nan") for c, v in tps.items()}
    rows = []
    for case in cases:
        if case in failed:
            rows.append(Row(bench="decode", case=case, model=name, context=T, layers=n_layers, unit="tok/s",
                            ok="FAILED", note=failed[case].replace("|", "/")))  # fmt: skip
            continue
        row = Row(bench="decode", case=case, model=name, context=T, layers=n_layers, value=med[case],
                  unit="tok/s", peak_mb=peaks[case][0])  # fmt: skip
        row.extra = {
            "best_tok_s": round(max(tps[case]), 2),
            "extra_mib": round(peaks[case][1], 1),
            "cache_bytes": nbytes[case],
        }
        base = {
            "kvcore B0": "mlx-lm KVCache",
            "kvcore quantize_cache 4b": "mlx-lm QuantizedKVCache 4b",
            "kvcore 25% kept (per-head 2-D)": "kvcore B0",
            "kvcore 25% kept (AdaKV ragged)": "kvcore B0",
            RAGGED_OPS: "kvcore B0",
        }.get(case)
        if base:
            row.extra["x_" + base.replace(" ", "_")] = round(med[case] / med[base], 3)
            row.note = f"{med[case] / med[base]:.3f}x {base}"
        if (case, T) in SEED:
            _seed_compare(row, (case, T), higher_is_better=True)
        rows.append(row)
    mx.clear_cache()
    return rows


def write(rows: list[Row], path: Path) -> None:
    dicts = [r.csv() for r in rows]
    fields: list[str] = []
    for d in dicts:
        fields += [k for k in d if k not in fields]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(dicts)


def table(rows: list[Row]) -> str:
    def f(x: float) -> str:
        return "" if x != x else f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"

    lines = [
        "| bench | case | T | L | value | unit | x copy / x base | seed | vs seed | peak MiB | +MiB | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rel = r.extra.get("x_plain_copy", "")
        rel = rel or next((v for k, v in r.extra.items() if k.startswith("x_")), "")
        lines.append(
            f"| {r.bench} | {r.case} | {r.context} | {r.layers} | {f(r.value)} | {r.unit} | {rel} | "
            f"{f(r.baseline)} | {f(r.ratio)} {r.ok} | {f(r.peak_mb)} | {r.extra.get('extra_mib', '')} | {r.note} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--small", action="store_true", help="4 thin layers, float32, 512/1024 tokens: a CPU smoke run"
    )
    ap.add_argument(
        "--contexts", type=int, nargs="+", default=None, help="default 8192 32768 (--small: 512 1024)"
    )
    ap.add_argument("--repeats", type=int, default=None, help="interleaved recompress rounds (9; --small 5)")
    ap.add_argument("--decode-layers", type=int, default=LAYERS)
    ap.add_argument(
        "--tokens", type=int, default=None, help="timed decode tokens, regenerate's n (32; --small 16)"
    )
    ap.add_argument("--rounds", type=int, default=None, help="interleaved decode/prefill rounds (3; 2)")
    ap.add_argument(
        "--regenerate-rounds",
        type=int,
        default=None,
        help="interleaved regenerate rounds (7; 2): a round is about 0.3 s, and 3 left its median within noise",
    )
    for section in ("recompress", "decode", "prefill", "regenerate"):
        ap.add_argument(f"--skip-{section}", action="store_true")
    args = ap.parse_args(argv)
    name = SMALL if args.small else NAME
    args.repeats = args.repeats or (5 if args.small else 9)
    args.tokens = args.tokens or (16 if args.small else 32)
    args.rounds = args.rounds or (2 if args.small else 3)
    args.regenerate_rounds = args.regenerate_rounds or (2 if args.small else 7)
    contexts = args.contexts or ([512, 1024] if args.small else [8192, 32768])
    dtype = mx.float32 if args.small else mx.bfloat16
    cache_layers = common.CONFIGS[name]["num_hidden_layers"]
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "gpu_results.csv"
    t0 = time.perf_counter()
    dev = mx.default_device()
    info: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # only descriptive
        info = dict(mx.device_info())
    import mlx_lm

    print(
        f"device {dev}, {info.get('device_name', info.get('architecture', '?'))}, mlx {mx.__version__}, "
        f"mlx-lm {mlx_lm.__version__}, Python {platform.python_version()}, {platform.machine()}, model {name}",
        flush=True,
    )
    if dev.type != mx.gpu and not args.small:
        print("WARNING: default device is not a GPU", file=sys.stderr)
    rows: list[Row] = []

    def done(what: str) -> None:
        write(rows, csv_path)
        print(f"[{time.perf_counter() - t0:.0f} s] {what} done", flush=True)

    for T in [] if args.skip_recompress else contexts:
        rows += recompress(T, args.repeats, cache_layers)
        done(f"recompress T={T}")
    model = None
    if not (args.skip_decode and args.skip_prefill and args.skip_regenerate):
        start = time.perf_counter()
        model = common.build(name, n_layers=args.decode_layers, dtype=dtype)
        print(f"[{time.perf_counter() - t0:.0f} s] model built in {time.perf_counter() - start:.1f} s, "
              f"{_mib(mx.get_active_memory()):.0f} MiB resident", flush=True)  # fmt: skip
    for T in [] if args.skip_decode else contexts:
        rows += decode_rows(model, T, args.tokens, args.rounds, name)
        done(f"decode T={T}")
    for T in [] if args.skip_prefill else contexts:
        rows += gpu_prefill_regen.prefill_rows(model, name, T, args.rounds)
        done(f"prefill T={T}")
    for T in [] if args.skip_regenerate else contexts:
        rows += gpu_prefill_regen.regenerate_rows(model, name, T, args.tokens, args.regenerate_rounds)
        done(f"regenerate T={T}")
    text = table(rows)
    (args.out / "gpu_results.md").write_text(text + "\n")
    print(text)
    print(f"total {time.perf_counter() - t0:.0f} s; CSV {csv_path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
