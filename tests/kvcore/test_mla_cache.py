"""MLA (deepseek_v3, kv_lora_rank != qk_nope_head_dim): gathering shared latent rows is exact attention over them.

The engine still refuses MLA (kvcore.model_checks) because capture cannot score it yet; this pins the half that
already works, so scoring can build on it: the latent cache has one "head" (latent rows and their RoPE key part)
shared by every query head, and `select_positions` on it gives logits equal to a float64 MLA attention over the
kept positions only, in mlx-lm's decode (one token, latent space) and multi-token paths alike.
"""

import sys

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from kvcore import attention, caches
from tests.kvcore.conftest import PROMPT, prefill, run
from tests.model_factory import ARCHS, build_model


@pytest.fixture(scope="module")
def mla(tmp_path_factory):
    model, tok = mlx_lm.load(str(build_model(tmp_path_factory.mktemp("mla") / "ds", "deepseek_v3")))
    attention.install(model)
    return model, tok.encode(PROMPT)


def _reference(model, keep: np.ndarray, T: int):
    """The model's attention function replaced by float64 softmax(q·k·scale + mask) over kept ∪ appended positions.

    mlx-lm passes MLA's RoPE scores as the additive mask, so the logits attention sees are exactly these."""
    module = sys.modules[type(model.layers[0].self_attn).__module__]

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        q, k, v, m = (np.array(x.astype(mx.float32), dtype=np.float64) for x in (queries, keys, values, mask))
        # Decode: one latent head for every query head; several tokens: per-head keys/values made from it.
        k, v = (np.broadcast_to(x, (x.shape[0], q.shape[1], *x.shape[2:])) for x in (k, v))
        s = np.einsum("bhld,bhsd->bhls", q, k) * scale + m
        n_q, total = q.shape[2], k.shape[2]
        out = np.zeros(q.shape[:3] + (v.shape[3],))
        for i in range(n_q):
            visible = np.concatenate([keep, np.arange(T, total - n_q + i + 1)])
            w = np.exp(s[:, :, i, visible] - s[:, :, i, visible].max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            out[:, :, i] = np.einsum("bhs,bhsd->bhd", w, v[:, :, visible])
        return mx.array(out.astype(np.float32))

    return module, sdpa


def test_shared_latent_selection_equals_float64_attention_over_kept_positions(mla):
    model, ids = mla
    config, T = ARCHS["deepseek_v3"], len(ids)
    assert config["kv_lora_rank"] != config["qk_nope_head_dim"]
    dense = prefill(model, ids)
    assert dense[0].keys.shape[1] == 1  # one latent "head" shared by every query head
    keep = np.sort(np.random.default_rng(0).choice(T, T // 2, replace=False))
    sparse = caches.select_positions(dense, [keep] * len(dense))
    row = (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 4  # latent + RoPE key, float32
    assert caches.cache_tensor_bytes(sparse) == len(dense) * keep.size * row
    reference, full = caches.copy_cache(dense), caches.copy_cache(dense)
    module, sdpa = _reference(model, keep, T)
    for tokens in ([5], [6, 7, 8], [9]):  # decode path, multi-token path, decode after it
        got = run(model, sparse, tokens)
        previous, module.scaled_dot_product_attention = module.scaled_dot_product_attention, sdpa
        try:
            want = run(model, reference, tokens)
        finally:
            module.scaled_dot_product_attention = previous
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=2e-4)
        assert np.abs(run(model, full, tokens) - want).max() > 1e-2  # dropping positions changes them
