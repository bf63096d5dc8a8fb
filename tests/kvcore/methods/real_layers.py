"""A tiny real model's layers in float64 NumPy, for the oracles of the kvpress scorers (leverage, cur, …).

Pre-RoPE queries and keys are recomputed from each layer's own q_proj / k_proj weights (and qwen3's q_norm /
k_norm) applied to the layer's input; post-RoPE queries from explicit rotation matrices built from the config;
cached keys and values come from a plain mlx-lm prefill. Nothing here calls kvcore.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from tests.kvcore.methods.test_expected_attention import inv_freqs, rope_matrix


@dataclass
class Layer:
    queries_pre: np.ndarray  # [H_q, T, D]
    keys_pre: np.ndarray  # [H_kv, T, D]
    queries: np.ndarray  # [H_q, T, D], post-RoPE
    keys: np.ndarray  # [H_kv, T, D], post-RoPE, as cached
    values: np.ndarray  # [H_kv, T, D]


def _rms(x: np.ndarray, weight, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * np.array(weight, dtype=np.float64)


_computed: dict[tuple[int, tuple[int, ...]], list[Layer]] = {}


def layers(model, config: dict, ids: list[int]) -> list[Layer]:
    """Every layer of `model` on the prompt `ids` (float64), computed once per (model, prompt) in a test run."""
    key = (id(model), tuple(ids))
    if key not in _computed:
        _computed[key] = _layers(model, config, ids)
    return _computed[key]


def _layers(model, config: dict, ids: list[int]) -> list[Layer]:
    inner, n = model.model, len(ids)
    d, eps = config["head_dim"], config["rms_norm_eps"]
    rotations = np.stack([rope_matrix(inv_freqs(config), p) for p in range(n)])  # [T, D, D]
    h = inner.embed_tokens(mx.array([ids]))
    cache = make_prompt_cache(model)
    out = []
    for layer, layer_cache in zip(inner.layers, cache, strict=True):
        x = np.array(layer.input_layernorm(h)[0], dtype=np.float64)
        attn = layer.self_attn
        q = (x @ np.array(attn.q_proj.weight, dtype=np.float64).T).reshape(n, -1, d).transpose(1, 0, 2)
        k = (x @ np.array(attn.k_proj.weight, dtype=np.float64).T).reshape(n, -1, d).transpose(1, 0, 2)
        if "q_norm" in attn:
            q, k = _rms(q, attn.q_norm.weight, eps), _rms(k, attn.k_norm.weight, eps)
        h = layer(h, mask="causal", cache=layer_cache)
        mx.eval(h)
        keys, values = (
            np.array(a[0, :, :n], dtype=np.float64) for a in (layer_cache.keys, layer_cache.values)
        )
        out.append(Layer(q, k, np.einsum("pij,hpj->hpi", rotations, q), keys, values))
    return out


def prompt_ids(model, n: int = 90, seed: int = 5) -> list[int]:
    """Random prompt ids inside the model's vocabulary (by default the one prompt the scorer tests share)."""
    return [int(t) for t in np.random.default_rng(seed).integers(1, model.args.vocab_size, n)]


def z_scored(scores: np.ndarray) -> np.ndarray:
    """kvpress's layer normalisation: one mean and one unbiased std over every head, std floored at 1e-6."""
    return (scores - scores.mean()) / max(scores.std(ddof=1), 1e-6)
