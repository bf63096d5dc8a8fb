"""Helpers for the cache tests: prefill, decode, and a brute-force NumPy attention over kept positions only."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from kvcore.model import attention

PROMPT = "def main(argv): return sum(x * x for x in argv) The quick brown fox jumps over the lazy dog."
#: The prompt the CLI tests write to a file: two lines of code and one of prose, twice.
CLI_PROMPT = (
    "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog.\n" * 2
)
GROUP = {"llama": 32, "qwen3": 64}  # head_dim 32 and 64: the largest group size each allows


@pytest.fixture(scope="session")
def models(loaded_models):
    """loaded_models with kvcore's attention installed (needed by ragged caches, a no-op for the others)."""
    for model, _ in loaded_models.values():
        attention.install(model)
    return loaded_models


@pytest.fixture
def prompt_file(tmp_path):
    """CLI_PROMPT in a file, for `--prompt-file`."""
    p = tmp_path / "prompt.txt"
    p.write_text(CLI_PROMPT)
    return p


def prompt_ids(tok) -> list[int]:
    return tok.encode(PROMPT)


def prefill(model, ids: list[int]) -> list:
    """Dense mlx-lm cache after running `ids` through the model."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([ids]), cache=cache))
    return cache


def run(model, cache: list, tokens: list[int]) -> np.ndarray:
    """Logits [N, vocab] for appending `tokens` to `cache` (the cache is updated)."""
    out = model(mx.array([tokens]), cache=cache)
    mx.eval(out)
    return np.array(out[0])


def greedy(model, cache: list, first: int, n: int) -> list[int]:
    """n greedy tokens, starting by feeding `first`."""
    tokens, y = [], first
    for _ in range(n):
        y = int(np.argmax(run(model, cache, [y])[-1]))
        tokens.append(y)
    return tokens


def _dequantized(
    x: mx.array, group: int, bits: int, exact: mx.array | None, mode: str = "affine"
) -> mx.array:
    """x packed and unpacked at `bits` in mx.quantize's `mode`, except the rows `exact` marks (kept as they are)."""
    packed = mx.quantize(x, group_size=group, bits=bits, mode=mode)
    deq = mx.dequantize(*packed, group_size=group, bits=bits, mode=mode).astype(x.dtype)  # MX modes: bf16
    return deq if exact is None else mx.where(exact, x, deq)


@contextmanager
def _attention_replaced(model, sdpa) -> Iterator:
    """The model's attention function is `sdpa` inside the block."""
    module = sys.modules[type(model.layers[0].self_attn).__module__]
    previous = module.scaled_dot_product_attention
    module.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        module.scaled_dot_product_attention = previous


@contextmanager
def reference_attention(
    model,
    cache: list,
    kept: list,
    T: int,
    quant: tuple[int, ...] | None = None,
    windows: Sequence[int | None] | None = None,
    float_positions: Sequence[int] | None = None,
    mode: str = "affine",
) -> Iterator:
    """Route the model's attention through float64 NumPy softmax over only the kept positions.

    `cache` is the dense cache the reference run uses (it identifies layers); `kept[l]` is None (all positions)
    or a list of per-kv-head arrays of kept prompt positions; positions >= T (appended tokens) are always kept,
    causally. With `quant=(bits, group)` or
    `(key_bits, group, value_bits)`, K and V are quantized and dequantized first, as a quantized cache holds
    them (a width of 16 leaves that side as it is; `mode`: the scheme's mx.quantize mode); `float_positions` (a float residual) are prompt positions
    left unquantized, and then appended tokens are too. `windows[l]` (a sliding-window layer) limits each query to the last `windows[l]` positions, itself
    included, as mlx-lm's window mask does; learned sinks (gpt_oss) add their logit to each softmax.
    """
    layer_of = {id(c): i for i, c in enumerate(cache)}

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        layer = layer_of[id(cache)]
        if quant is not None:
            bits, group, *value_bits = quant
            exact = None
            if float_positions is not None:
                rows = np.arange(keys.shape[2])
                exact = mx.array((np.isin(rows, float_positions) | (rows >= T))[:, None])
            keys, values = (
                x if b == 16 else _dequantized(x, group, b, exact, mode)
                for x, b in ((keys, bits), (values, value_bits[0] if value_bits else bits))
            )
        q, k, v = (np.array(x, dtype=np.float64) for x in (queries, keys, values))
        sinks = None if sinks is None else np.array(sinks.astype(mx.float32), dtype=np.float64)
        n_q, n_kv, total = q.shape[2], k.shape[1], k.shape[2]
        rep = q.shape[1] // n_kv
        out = np.zeros(q.shape[:3] + v.shape[3:])  # values may be narrower than keys (deepseek_v2)
        for hq in range(q.shape[1]):
            h = hq // rep
            prompt = np.arange(T) if kept[layer] is None else np.asarray(kept[layer][h])
            for i in range(n_q):
                pos = total - n_q + i
                visible = np.concatenate([prompt, np.arange(T, pos + 1)])
                if windows is not None and windows[layer] is not None:
                    visible = visible[pos - visible < windows[layer]]
                s = (k[0, h, visible] @ q[0, hq, i]) * scale
                top = s.max() if sinks is None else max(s.max(), float(sinks[hq]))
                w = np.exp(s - top)
                total_w = w.sum() + (0.0 if sinks is None else np.exp(float(sinks[hq]) - top))
                out[0, hq, i] = (w / total_w) @ v[0, h, visible]
        return mx.array(out.astype(np.float32))

    with _attention_replaced(model, sdpa):
        yield


@contextmanager
def reference_mla_attention(model, cache: list, kept: list, T: int) -> Iterator:
    """Route a latent (MLA) model's attention through float64 softmax(q·k·scale + mask) over kept positions only.

    mlx-lm passes MLA's RoPE scores as the additive mask (non-causal entries at the dtype's minimum), so these
    are exactly the logits attention sees; one token passes the absorbed query against the latent itself,
    several tokens per-head keys and values made from it. `cache` is the dense cache the reference run uses;
    `kept[l]` is None (all positions) or [positions] for the layer's one latent head; positions >= T are kept.
    """
    layer_of = {id(c): i for i, c in enumerate(cache)}

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        layer = layer_of[id(cache)]
        q, k, v, m = (np.array(x.astype(mx.float32), dtype=np.float64) for x in (queries, keys, values, mask))
        k, v = (np.broadcast_to(x, (x.shape[0], q.shape[1], *x.shape[2:])) for x in (k, v))
        s = np.einsum("bhld,bhsd->bhls", q, k) * scale + m
        n_q, total = q.shape[2], k.shape[2]
        prompt = np.arange(T) if kept[layer] is None else np.asarray(kept[layer][0])
        out = np.zeros(q.shape[:3] + (v.shape[3],))
        for i in range(n_q):
            visible = np.concatenate([prompt, np.arange(T, total - n_q + i + 1)])
            w = np.exp(s[:, :, i, visible] - s[:, :, i, visible].max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            out[:, :, i] = np.einsum("bhs,bhsd->bhd", w, v[:, :, visible])
        return mx.array(out.astype(np.float32))

    with _attention_replaced(model, sdpa):
        yield
