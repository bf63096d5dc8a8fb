"""think: kvpress's channel scores in NumPy, narrow keys that attend exactly as zeroed ones, bytes from the arrays."""

import mlx.core as mx
import numpy as np
import pytest

from kvcore.cache import sparse as caches
from kvcore.engine.session import CompressionConfig, Session
from kvcore.methods import get

PROMPT = "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=4, chat_template=False)
    return s


def _rows(layer) -> np.ndarray:
    keys, _ = layer.keys_and_values()
    return np.array(keys[0], np.float64)  # [H_kv, n, D]


@pytest.mark.parametrize("inner", ["snapkv", "kvzip"])  # kvzip: ragged heads
def test_think_prunes_kvpress_channels_and_attends_as_zeroed_keys(session, inner):
    ratio = 0.5
    plain = session.compress(CompressionConfig(inner, ratio))
    state = session.compress(CompressionConfig(f"think-{inner}", ratio))
    np.testing.assert_array_equal(state.kept, plain.kept)
    channels = Session.kept_channels(state)
    zeroed = caches.copy_cache(plain.cache)
    head_dim = session.info.head_dim
    for i, obs in enumerate(session._observed("paper").observations):
        keys = _rows(plain.cache[i])
        counts = plain.cache[i].kept_counts
        q = np.array(obs.window_queries[:, -32:], np.float64)
        q_norm = (q**2).mean(axis=1).reshape(obs.n_kv_heads, obs.group, -1).mean(axis=1)
        k_norm = np.stack([(keys[h, : counts[h]] ** 2).mean(axis=0) for h in range(len(counts))])
        pruned = np.argsort(q_norm * k_norm, axis=1, kind="stable")[:, : int(head_dim * ratio)]
        want = np.stack([np.setdiff1d(np.arange(head_dim), p) for p in pruned])
        np.testing.assert_array_equal(channels[i], want)
        mask = np.zeros((len(counts), head_dim), np.float32)
        np.put_along_axis(mask, want, 1.0, axis=1)
        layer = zeroed[i]
        layer.keys = layer.keys * mx.array(mask)[None, :, None, :]
    tokens = session.dense_tokens[:4]
    ours = session._logits_after(state.cache, tokens, 4)
    theirs = session._logits_after(zeroed, tokens, 4)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    narrow = sum(int(c.kept_counts.max()) * c.n_heads * int(head_dim * ratio) * 4 for c in plain.cache)
    assert state.bytes_compressed == plain.bytes_compressed - narrow


@pytest.mark.parametrize("schedule", ["paper", "mlx-lm"])
def test_think_decodes_through_narrow_keys(session, schedule):
    state = session.compress(CompressionConfig("think", 0.5, schedule=schedule))
    result = session.regenerate(state, n=4)
    assert len(result.tokens) == 4


def test_think_refuses_packed_keys_and_a_scorer_it_cannot_wrap(session):
    with pytest.raises(ValueError, match="quantization off"):
        session.compress(CompressionConfig("think", 0.5, bits=4, group_size=32))
    with pytest.raises(ValueError, match="think"):
        get("think-tova")
