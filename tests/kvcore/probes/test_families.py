"""Attention families in bf16 and 4-bit weights, through Session as a user runs them.

For llama, qwen3, gemma3_text (sliding-window layers), gpt_oss (sinks and sliding-window layers) and deepseek_v3
(multi-head latent attention, kv_lora_rank != qk_nope_head_dim: one latent head shared by every query head), each
built in bf16 and quantized to 4 bits by mlx_lm.convert, and deepseek_v2 in bf16 (its latent expanded into
per-head keys and narrower values in a plain KVCache): `full` at ratio 1 reproduces mlx-lm's own greedy
generation; a compressed cache's teacher-forced logits equal a float64 attention over the kept positions only
(MLA's over the kept latent rows); the bytes reported are those of the stored arrays in steady state.
"""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache

from kvcore.cache import sparse as caches
from kvcore.engine.session import CompressionConfig, Session
from kvcore.model import loading
from tests.kvcore.conftest import reference_attention, reference_mla_attention
from tests.model_factory import ARCHS, build_model
from tests.reference_logits import compressed_logits, dense_logits

PROMPT = "def main(argv): return sum(x * x for x in argv) The quick brown fox jumps over the lazy dog."
N_TOKENS = 5
FAMILIES = [
    (arch, w) for arch in ("llama", "qwen3", "gemma3_text", "gpt_oss", "deepseek_v3") for w in ("bf16", "q4")
] + [("deepseek_v2", "bf16")]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{(arch, "bf16" | "q4"): folder}: bf16 random weights, and their 4-bit mlx_lm.convert."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for arch in dict.fromkeys(a for a, _ in FAMILIES):
        out[arch, "bf16"] = build_model(root / arch, arch, dtype="bfloat16")
        if (arch, "q4") not in FAMILIES:
            continue
        out[arch, "q4"] = root / f"{arch}-q4"
        mlx_lm.convert(str(out[arch, "bf16"]), str(out[arch, "q4"]), quantize=True, q_bits=4, q_group_size=32)
    return out


@pytest.fixture(scope="module")
def sessions(folders):
    """One prefilled Session per family, built on first use."""
    built: dict = {}

    def get(key):
        if key not in built:
            s = Session.load(str(folders[key]))
            s.prefill(PROMPT, n_tokens=N_TOKENS, chat_template=False)
            built[key] = s
        return built[key]

    return get


def _windows(arch: str, state) -> list[int | None]:
    """Per layer: the sliding window of a layer the state lists as not compressible, else None."""
    window = ARCHS[arch].get("sliding_window")
    return [window if i in state.not_compressible else None for i in range(state.kept.shape[0])]


@pytest.mark.parametrize("arch,weights", FAMILIES)
def test_full_equals_mlx_lm_greedy_generation(folders, sessions, arch, weights):
    session = sessions((arch, weights))
    model, tok = mlx_lm.load(str(folders[arch, weights]))
    loading.upcast_on_cpu(model)  # as the engine runs it
    ids = tok.encode(PROMPT)
    assert session.prompt_ids == ids
    want = [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=N_TOKENS)]
    assert session.dense_tokens == want
    for schedule in ("paper", "mlx-lm"):
        state = session.compress(CompressionConfig("full", 1.0, schedule=schedule))
        regen = session.regenerate(state)
        assert regen.tokens == want and regen.metrics["kl_max"] == 0.0
        assert state.bytes_compressed == state.bytes_dense


@pytest.mark.parametrize("arch,weights", FAMILIES)
@pytest.mark.parametrize("schedule", ["paper", "mlx-lm"])
def test_compressed_logits_equal_float64_attention_over_kept_positions(sessions, arch, weights, schedule):
    session = sessions((arch, weights))
    model, ids, tokens = session.model, session.prompt_ids, session.dense_tokens
    state = session.compress(CompressionConfig("snapkv", 0.5, schedule=schedule))
    T = state.kept.shape[2]
    assert len(ids) - (schedule == "mlx-lm") == T and ARCHS[arch].get("sliding_window", 0) < T
    dense = dense_logits(model, ids, tokens)
    got = compressed_logits(model, state.cache, ids, tokens, schedule, dense)
    kept = [
        None if i in state.not_compressible else [np.flatnonzero(row) for row in state.kept[i]]
        for i in range(len(state.kept))
    ]
    assert any(k is not None for k in kept) and all(len(p) < T for k in kept if k for p in k)
    feed = list(tokens[:-1]) if schedule == "paper" else [ids[-1], *tokens[:-1]]
    windows = _windows(arch, state)

    def reference(kept_positions):
        cache = [KVCache() for _ in model.layers]  # every position, so the reference applies windows itself
        mx.eval(model(mx.array([ids[:T]]), cache=cache))
        if arch == "deepseek_v3":
            assert state.kept.shape[1] == 1  # the latent head: one selection shared by every query head
            attend = reference_mla_attention(model, cache, kept_positions, T)
        else:
            attend = reference_attention(model, cache, kept_positions, T, windows=windows)
        with attend:
            return np.array(model(mx.array([feed]), cache=cache)[0].astype(mx.float32))

    skip = session.first_compressed_step(schedule)
    # The reference over every position is the model's own dense logits (windows and sinks right) ...
    np.testing.assert_allclose(reference([None] * len(kept)), dense[skip:], atol=2e-4, rtol=2e-4)
    want = reference(kept)
    np.testing.assert_allclose(got[skip:], want, atol=2e-4, rtol=2e-4)
    # ... and the kept positions alone give logits far from them: the selection is what is being checked.
    assert np.abs(want - dense[skip:]).max() > 1e-2


def _stored(layer) -> int:
    """Bytes of the arrays a layer's attention reads."""
    if isinstance(layer, caches.SparseKVCache):
        keys, values = layer.keys_and_values()
        return keys.nbytes + values.nbytes
    return layer.keys[..., : layer.offset, :].nbytes + layer.values[..., : layer.offset, :].nbytes


@pytest.mark.parametrize("arch,weights", FAMILIES)
@pytest.mark.parametrize("ratio", [1.0, 0.5])
def test_bytes_equal_the_stored_arrays_in_steady_state(sessions, arch, weights, ratio):
    """After one more token (mlx-lm trims window layers then), stored bytes are the reported ones plus that
    token's row in every layer that grows; float32 rows, since the engine upcasts bf16 on a CPU."""
    session = sessions((arch, weights))
    info = session.info
    state = session.compress(CompressionConfig("snapkv", ratio, schedule="paper"))
    stepped = caches.copy_cache(state.cache)
    mx.eval(session.model(mx.array([[session.dense_tokens[0]]]), cache=stepped))
    row = info.n_kv_heads * (info.head_dim + info.value_dim) * 4  # one position's K and V over all kv-heads
    window = ARCHS[arch].get("sliding_window")
    for i, layer in enumerate(stepped):
        assert layer.keys.dtype == mx.float32
        if i in state.not_compressible:
            assert _stored(layer) == window * row
        else:
            n = int(state.kept[i, 0].sum())
            assert (state.kept[i].sum(axis=1) == n).all() and n == max(
                1, int(state.kept.shape[2] * (1 - (1 - ratio)))
            )  # kvpress's budget
            assert _stored(layer) == (n + 1) * row
    grows = len(stepped) - len(state.not_compressible)
    assert sum(_stored(c) for c in stepped) == state.bytes_compressed + grows * row
    assert sum(r["bytes_compressed"] for r in state.stats_rows) == state.bytes_compressed
    if ratio == 1.0:
        assert state.bytes_compressed == state.bytes_dense
