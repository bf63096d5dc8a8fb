"""merging (kvpress's MergingPress, after Token Merging, Bolya et al. 2023, and D2O, Wan et al. 2024): the inner
method's positions, with each evicted value folded into a kept one instead of dropped.

Per kv-head, each evicted position goes to the kept position whose cached (post-RoPE) key is most cosine-similar.
It merges when that similarity is at least `similarity_threshold` and, with `merge_fraction` < 1, among the
most similar that fraction of the evicted ones (a quantile, as kvpress). Its weight is
max(sim, 0) · ‖v_e‖ / (‖v_e‖ + ‖v_t‖ + ε); each target's value becomes (v_t + Σ w·v_e) / (1 + Σ w). Keys are
unchanged, so RoPE stays right. Named `merging-INNER`; bare `merging` is over snapkv. Where each evicted
position went is recorded on the stored layer (`merged_into`, read by `Session.merge_targets`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache.sparse import SparseKVCache
from kvcore.declared import param
from kvcore.methods.base import Method
from kvcore.methods.snapkv import SnapKV
from kvcore.methods.wrapper import Wrapper, store_refusal

EPS = 1e-6


def merge_head(
    keys: np.ndarray, values: np.ndarray, kept: np.ndarray, threshold: float, fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """One head: (the kept rows' merged values [n, D] float32, target position per position [T] int, −1 where
    the position is kept or not merged). keys, values [T, D] are the dense rows; kept sorted positions."""
    n_tokens = keys.shape[0]
    evicted = np.setdiff1d(np.arange(n_tokens), kept)
    kept_values = values[kept].astype(np.float32)
    targets = np.full(n_tokens, -1, np.int64)
    if evicted.size == 0 or kept.size == 0:
        return kept_values, targets
    k = keys.astype(np.float32)
    unit = k / np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), EPS)
    sims = unit[evicted] @ unit[kept].T  # [E, n]
    target = np.argmax(sims, axis=1)
    best = sims[np.arange(evicted.size), target]
    ok = best >= threshold
    if fraction < 1.0 and ok.any():
        cut = np.quantile(np.where(ok, best, -np.inf), 1.0 - fraction)
        ok &= best >= cut
    ev_values = values[evicted].astype(np.float32)
    ev_norm = np.linalg.norm(ev_values, axis=-1)
    tg_norm = np.linalg.norm(kept_values, axis=-1)[target]
    weights = np.maximum(best, 0) * ok * ev_norm / (ev_norm + tg_norm + EPS)
    added = np.zeros_like(kept_values)
    np.add.at(added, target, weights[:, None] * ev_values)
    total = np.zeros(kept.size, np.float32)
    np.add.at(total, target, weights)
    merged = np.where(total[:, None] > 0, (kept_values + added) / (1.0 + total)[:, None], kept_values)
    targets[evicted[ok & (weights > 0)]] = kept[target[ok & (weights > 0)]]
    return merged.astype(np.float32), targets


@dataclass(frozen=True)
class Merging(Wrapper):
    name = "merging"
    description = (
        "Merging (kvpress MergingPress, after ToMe/D2O): the inner method's positions, each evicted value folded "
        "into its most key-similar kept one"
    )
    paper = (
        "Token Merging: Your ViT But Faster (Bolya et al. 2023), arXiv:2210.09461; D2O: Dynamic "
        "Discriminative Operations for Efficient Generative Inference (Wan et al. 2024), arXiv:2406.13035"
    )
    wraps = True
    default_inner = "snapkv"

    inner: Method = dataclasses.field(default_factory=SnapKV)
    similarity_threshold: float = param(
        0.0, "least cosine similarity of keys for an evicted value to merge", minimum=0.0, maximum=1.0
    )
    merge_fraction: float = param(
        1.0, "share of the evicted values merged (the most similar)", minimum=0.01, maximum=1.0
    )

    @classmethod
    def refusal(cls, inner: type[Method]) -> str | None:
        """A per-head scorer, kvzip's global eviction included: only what is stored changes."""
        return store_refusal(cls.name, inner)

    def store(self, cache: list[Any], model: Any, observations: Any = ()) -> list[Any]:
        """Each compressed layer's kept values with the evicted ones merged in; `merged_into` [H_kv, T] records
        where each evicted position went (−1: kept, or not merged)."""
        cache = self.inner.store(cache, model, observations)
        for i, (layer, obs) in enumerate(zip(cache, observations, strict=False)):
            if obs is None:
                continue
            if obs.latent or obs.values is None:
                raise ValueError("merging folds values per kv-head: not on latent (MLA) layers")
            if type(layer) is not SparseKVCache:
                raise ValueError(
                    f"merging rewrites float values: turn quantization off (layer {i} is packed)"
                )
            keys = np.array(obs.keys.astype(mx.float32))
            values = np.array(obs.values.astype(mx.float32))
            _, stored = layer.keys_and_values()
            rows = np.array(stored[0].astype(mx.float32))  # [H_kv, n, D], ragged heads padded at the end
            into = np.full(keys.shape[:2], -1, np.int64)
            for h, kept in enumerate(layer.retained_positions):
                merged, into[h] = merge_head(
                    keys[h],
                    values[h],
                    np.asarray(kept, np.int64),
                    self.similarity_threshold,
                    self.merge_fraction,
                )
                rows[h, : kept.size] = merged
            new_values = mx.array(rows[None]).astype(stored.dtype)
            mx.eval(new_values)
            stored_keys, _ = layer.keys_and_values()
            layer._set_rows(stored_keys, new_values, layer._selection, layer._prefix_counts, layer.offset)
            layer.merged_into = into
        return cache
