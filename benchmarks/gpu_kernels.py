"""kvcore's CUDA kernels against the MLX-operations path they replace: correctness first, then time (issue 15).

    PYTHONUNBUFFERED=1 python -m benchmarks.gpu_kernels --out DIR     # on a CUDA GPU (MLX's CUDA backend)

CI has no GPU, so this is where the kernels are checked. In one run, on the Llama-3.1-8B head layout (32 query
heads, 8 kv-heads of 128, bf16):

  1. ragged decode (`kvcore.kernels.ragged_decode`): an AdaKV 25 % selection of a random cache at 8k and 32k plus
     three appended rows; one query through `kvcore.model.attention.sdpa` with the kernel and with it switched off (the
     per-head masked fallback), each against a float64 reference over each head's real rows; then the time of 32
     such layers, rounds interleaved, median.
  2. h2o sums (`kvcore.kernels.h2o_sums`): one capture chunk of 2048 queries over 2048, 8192 and 32768 keys, with
     earlier sums added: kernel against `kvcore.capture.prefill._accumulate_h2o` with the kernels switched off (float32
     softmax blocks): relative error, how far each query's probabilities are from summing to 1, the overlap of the
     25 % each keeps per kv-head; time of both, of the kernels before their pipelined version
     (`benchmarks/h2o_sums_before.py`) and of MLX's fused causal attention over the same chunk. Also at 2048 keys
     with head_dim 64 (fp16) and 256 (bf16), the other shapes the kernels take.
  3. end to end on 4 layers of the same layout (random weights): `prefill_with_capture` of 4096 tokens, h2o eager
     with and without the kernels (sums compared layer by layer), then 16 greedy tokens decoded from the AdaKV
     25 % snapkv cache with and without the ragged kernel (logits and tokens compared).

Rows go to DIR/gpu_kernels.csv. On a machine without CUDA both sides run the operations path (a smoke run of
the script: every error is 0 and every ratio about 1).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common, h2o_sums_before
from benchmarks.bench_decode import attention_for
from benchmarks.common import Row, median_ms, synthetic_cache
from benchmarks.gpu_bench import H_KV, H_Q, HEAD_DIM, NAME, SMALL, write
from kvcore import kernels
from kvcore.cache import sparse as caches
from kvcore.capture.prefill import LayerObservation, _accumulate_h2o, prefill_with_capture
from kvcore.kernels import h2o_sums, ragged_decode
from kvcore.methods.selection import rank, select
from kvcore.model import attention

# isort: split
import mlx.core as mx

RATIO = 0.25
SCALE = HEAD_DIM**-0.5
CHUNK = 2048


def _ragged_layer(T: int, seed: int) -> tuple[Any, mx.array, mx.array, mx.array]:
    """An AdaKV 25 % layer of a random bf16 cache with 3 appended rows, and one query's (q, keys, values)."""
    dense = synthetic_cache(1, H_KV, HEAD_DIM, T, mx.bfloat16, seed=seed)
    obs = [LayerObservation(dense[0].keys[0, :, :T], mx.zeros((H_Q, 1, HEAD_DIM)), None, H_Q, H_KV, SCALE)]
    (layer,) = caches.select_positions(dense, select(rank(obs, "knorm"), RATIO, adakv=True))
    rng = np.random.default_rng(seed)
    for _ in range(3):
        new = [mx.array(rng.standard_normal((1, H_KV, 1, HEAD_DIM)), mx.bfloat16) for _ in range(2)]
        keys, values = layer.update_and_fetch(*new)
    q = mx.array(rng.standard_normal((1, H_Q, 1, HEAD_DIM)), mx.bfloat16)
    mx.eval(keys, values, q)
    return layer, q, keys, values


def _ragged_reference(layer: Any, q: mx.array, keys: mx.array, values: mx.array) -> np.ndarray:
    """float64 attention of each query head over its kv-head's real rows only."""
    k = np.asarray(keys.astype(mx.float32), np.float64)[0]
    v = np.asarray(values.astype(mx.float32), np.float64)[0]
    qq = np.asarray(q.astype(mx.float32), np.float64)[0, :, 0]
    meta = np.asarray(layer.ragged_meta())
    n_prefix, group = int(meta[-1]), H_Q // H_KV
    out = np.zeros((H_Q, HEAD_DIM))
    for h in range(H_Q):
        kv = h // group
        rows = np.r_[0 : meta[kv], n_prefix : k.shape[1]]
        s = k[kv, rows] @ qq[h] * SCALE
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[kv, rows]
    return out


def ragged_rows(T: int, rounds: int) -> list[Row]:
    layer, q, keys, values = _ragged_layer(T, seed=T)
    used = ragged_decode.applies(q, keys, layer)

    def attend() -> mx.array:
        return attention.sdpa(q, keys, values, layer, SCALE, None)

    def ops() -> mx.array:
        with kernels.switched(False):
            return attention.sdpa(q, keys, values, layer, SCALE, None)

    ref = _ragged_reference(layer, q, keys, values)
    err = {name: float(np.abs(np.asarray(fn().astype(mx.float32))[0, :, 0] - ref).max()) for name, fn in
           (("kernel", attend), ("ops", ops))}  # fmt: skip
    layers = 32
    ms = median_ms(
        {
            "kernel": lambda: [attend() for _ in range(layers)],
            "ops": lambda: [ops() for _ in range(layers)],
        },
        rounds,
    )
    meta = np.asarray(layer.ragged_meta())
    note = f"kernel used: {used}; kept rows per head {meta[:-1].min()}-{meta[:-1].max()} of width {meta[-1]}"
    print(f"  ragged T={T}: max |err| kernel {err['kernel']:.2e}, ops {err['ops']:.2e}; "
          f"{layers} layers {ms['kernel']:.3f} ms vs {ms['ops']:.3f} ms; {note}", flush=True)  # fmt: skip
    return [
        Row(bench="ragged decode", case="kernel vs float64 reference", model=NAME, context=T, value=err["kernel"],
            unit="max abs err", baseline=err["ops"], note="baseline: the masked MLX fallback's error; " + note),
        Row(bench="ragged decode", case=f"{layers} layers, kernel / MLX masked fallback", model=NAME, context=T,
            layers=layers, value=ms["kernel"], unit="ms", baseline=ms["ops"], ratio=ms["kernel"] / ms["ops"],
            note=note),
    ]  # fmt: skip


def h2o_rows(n_keys: int, rounds: int, head_dim: int = HEAD_DIM, dtype: Any = mx.bfloat16) -> list[Row]:
    rng = np.random.default_rng(n_keys)
    q = mx.array(rng.standard_normal((H_Q, CHUNK, head_dim)), dtype)
    keys = mx.array(rng.standard_normal((H_KV, n_keys, head_dim)), dtype)
    scale = head_dim**-0.5
    n_prev = n_keys - CHUNK
    prev = mx.array(rng.random((H_Q, n_prev)) * 4, mx.float32) if n_prev else None
    mx.eval([x for x in (q, keys, prev) if x is not None])
    used = h2o_sums.applies(q, keys)

    def fused() -> mx.array:
        return _accumulate_h2o(prev, q, keys, scale)

    def ops() -> mx.array:
        with kernels.switched(False):
            return _accumulate_h2o(prev, q, keys, scale)

    def before() -> mx.array:
        with h2o_sums_before.swapped():
            return _accumulate_h2o(prev, q, keys, scale)

    a, b = np.asarray(fused()), np.asarray(ops())
    rel = float((np.abs(a - b) / np.maximum(np.abs(b), 1e-30)).max())
    added = a - (np.pad(np.asarray(prev), ((0, 0), (0, CHUNK))) if prev is not None else 0)
    row_sum = float(np.abs(added.sum(axis=1) - CHUNK).max() / CHUNK)  # each query's probabilities sum to 1
    n_keep = max(1, int(RATIO * n_keys))
    per_kv = [x.reshape(H_KV, -1, n_keys).sum(axis=1) for x in (a, b)]
    overlap = statistics.mean(
        len(np.intersect1d(np.argsort(-per_kv[0][h])[:n_keep], np.argsort(-per_kv[1][h])[:n_keep])) / n_keep
        for h in range(H_KV)
    )
    qa = q[None]
    ka = keys[None]
    ms = median_ms(
        {
            "kernel": fused,
            "ops": ops,
            "before": before,
            "sdpa": lambda: mx.fast.scaled_dot_product_attention(qa, ka, ka, scale=scale, mask="causal"),
        },
        rounds,
    )
    model = NAME if head_dim == HEAD_DIM else f"{NAME} heads, head_dim {head_dim}, {dtype}"
    note = f"kernel used: {used}; chunk of {CHUNK} queries"
    print(f"  h2o keys={n_keys} D={head_dim}: max rel err {rel:.2e}, row-sum err {row_sum:.2e}, 25 % overlap "
          f"{overlap:.4f}; {ms['kernel']:.2f} ms vs ops {ms['ops']:.2f} ms, before {ms['before']:.2f} ms, "
          f"fused attention {ms['sdpa']:.2f} ms", flush=True)  # fmt: skip
    return [
        Row(bench="h2o sums", case="kernel vs MLX ops (float32 softmax)", model=model, context=n_keys, value=rel,
            unit="max rel err", note=f"row sums off 1 by {row_sum:.2e}; 25 % kept overlap {overlap:.4f}; " + note,
            extra={"row_sum_err": row_sum, "overlap_25": round(overlap, 5)}),
        Row(bench="h2o sums", case="one chunk, kernel / MLX ops", model=model, context=n_keys, value=ms["kernel"],
            unit="ms", baseline=ms["ops"], ratio=ms["kernel"] / ms["ops"], note=note),
        Row(bench="h2o sums", case="one chunk, kernel / kernel before", model=model, context=n_keys,
            value=ms["kernel"], unit="ms", baseline=ms["before"], ratio=ms["kernel"] / ms["before"], note=note),
        Row(bench="h2o sums", case="one chunk, kernel / MLX fused causal attention", model=model, context=n_keys,
            value=ms["kernel"], unit="ms", baseline=ms["sdpa"], ratio=ms["kernel"] / ms["sdpa"], note=note),
    ]  # fmt: skip


def _greedy(model: Any, cache: list[Any], first: int, n: int) -> tuple[list[int], list[np.ndarray]]:
    tok, toks, logits = mx.array([[first]]), [], []
    for _ in range(n):
        out = model(tok, cache=cache)[0, -1].astype(mx.float32)
        nxt = int(mx.argmax(out).item())
        toks.append(nxt)
        logits.append(np.asarray(out))
        tok = mx.array([[nxt]])
    return toks, logits


def end_to_end_rows(T: int, n_tokens: int) -> list[Row]:
    model = common.build(SMALL, dtype=mx.bfloat16)
    ids = np.random.default_rng(0).integers(0, model.args.vocab_size, T).tolist()
    with attention_for(model, True):
        fused = prefill_with_capture(model, ids, h2o="eager")
        with kernels.switched(False):
            ops = prefill_with_capture(model, ids, h2o="eager")
        rel, overlap = 0.0, []
        for a, b in zip(fused.observations, ops.observations, strict=True):
            x, y = np.asarray(a.h2o_sums), np.asarray(b.h2o_sums)
            rel = max(rel, float((np.abs(x - y) / np.maximum(np.abs(y), 1e-30)).max()))
        sel = [select(rank(r.observations, "h2o"), RATIO) for r in (fused, ops)]
        for la, lb in zip(*sel, strict=True):
            overlap += [
                len(np.intersect1d(x, y)) / len(y)
                for x, y in zip(np.asarray(la), np.asarray(lb), strict=True)
            ]
        ragged = select(rank(fused.observations, "snapkv"), RATIO, adakv=True)
        runs = {}
        for name, on in (("kernel", True), ("ops", False)):
            with kernels.switched(on):
                runs[name] = _greedy(model, caches.select_positions(fused.cache, ragged), ids[-1], n_tokens)
    same = sum(x == y for x, y in zip(runs["kernel"][0], runs["ops"][0], strict=True))
    first_diff = float(np.abs(runs["kernel"][1][0] - runs["ops"][1][0]).max())
    layer = caches.select_positions(fused.cache, ragged)[0]
    used = ragged_decode.applies(mx.zeros((1, H_Q, 1, HEAD_DIM), mx.bfloat16), layer.keys, layer)
    print(f"  end to end T={T}: h2o sums max rel err {rel:.2e}, h2o 25 % overlap {statistics.mean(overlap):.4f}; "
          f"decode {same}/{n_tokens} tokens equal, first-step logits max |diff| {first_diff:.3g} "
          f"(ragged kernel used: {used})", flush=True)  # fmt: skip
    return [
        Row(bench="end to end", case="capture h2o eager: kernel vs MLX ops sums", model=SMALL, context=T,
            layers=len(model.layers), value=rel, unit="max rel err",
            note=f"h2o 25 % per-head kept overlap {statistics.mean(overlap):.4f}"),
        Row(bench="end to end", case="AdaKV 25 % decode: ragged kernel vs MLX masked fallback", model=SMALL,
            context=T, layers=len(model.layers), value=same, unit=f"of {n_tokens} tokens equal",
            note=f"first-step logits max |diff| {first_diff:.3g}; kernel used: {used}"),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--key-lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--e2e-tokens", type=int, default=4096)
    args = ap.parse_args(argv)
    if min(args.key_lengths) < CHUNK:
        ap.error(f"--key-lengths: each must be at least the chunk of {CHUNK} queries it is measured with")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"device {mx.default_device()}, mlx {mx.__version__}, CUDA kernels ready: {kernels.cuda_ready()}",
          flush=True)  # fmt: skip
    t0 = time.perf_counter()
    rows: list[Row] = []
    sections: list[tuple[str, Callable[[], list[Row]]]] = []
    sections += [(f"ragged T={T}", lambda T=T: ragged_rows(T, args.rounds)) for T in args.contexts]
    sections += [(f"h2o keys={n}", lambda n=n: h2o_rows(n, args.rounds)) for n in args.key_lengths]
    sections += [
        (f"h2o keys={CHUNK} D={d}", lambda d=d, t=t: h2o_rows(CHUNK, args.rounds, d, t))
        for d, t in ((64, mx.float16), (256, mx.bfloat16))
    ]
    sections.append(("end to end", lambda: end_to_end_rows(args.e2e_tokens, 16)))
    for what, run in sections:
        try:
            rows += run()
        except Exception as e:  # a kernel that fails to compile or launch: report it, run the rest
            print(f"  {what} FAILED: {type(e).__name__}: {str(e)[:2000]}", flush=True)
            rows.append(Row(bench=what, case="FAILED", ok="FAILED", note=str(e).splitlines()[0][:300]))
        write(rows, args.out / "gpu_kernels.csv")
        print(f"[{time.perf_counter() - t0:.0f} s] {what} done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
