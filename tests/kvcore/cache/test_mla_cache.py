"""MLA (deepseek_v3, kv_lora_rank != qk_nope_head_dim): gathering shared latent rows is exact attention over them.

The latent cache has one "head" (latent rows and their RoPE key part) shared by every query head, and
`select_positions` on it gives logits equal to a float64 MLA attention over the kept positions only, in mlx-lm's
decode (one token, latent space) and multi-token paths alike. Scoring is tests/kvcore/capture/test_mla_capture.py's.
"""

import mlx_lm
import numpy as np
import pytest

from kvcore.cache import sparse as caches
from kvcore.model import attention
from tests.kvcore.conftest import PROMPT, prefill, reference_mla_attention, run
from tests.model_factory import ARCHS, build_model


@pytest.fixture(scope="module")
def mla(tmp_path_factory):
    model, tok = mlx_lm.load(str(build_model(tmp_path_factory.mktemp("mla") / "ds", "deepseek_v3")))
    attention.install(model)
    return model, tok.encode(PROMPT)


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
    for tokens in ([5], [6, 7, 8], [9]):  # decode path, multi-token path, decode after it
        got = run(model, sparse, tokens)
        with reference_mla_attention(model, reference, [[keep]] * len(dense), T):
            want = run(model, reference, tokens)
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=2e-4)
        assert np.abs(run(model, full, tokens) - want).max() > 1e-2  # dropping positions changes them
