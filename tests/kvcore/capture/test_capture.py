"""Capture on real mlx-lm GQA models: window queries, keys and h2o sums equal NumPy from the model's own q/k."""

import math

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from kvcore import defaults
from kvcore.capture import prefill as capture
from kvcore.model import attention

PROMPT = "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog."


def reference_qk(model, ids):
    """Every layer's full post-RoPE queries and keys from one plain prefill, seen through a bare observer."""
    attention.install(model)
    seen = {}

    def observer(q, k, v, cache, scale, mask):
        seen[id(cache)] = (np.array(q[0].astype(mx.float32)), np.array(k[0].astype(mx.float32)), scale)

    cache = make_prompt_cache(model)
    with attention.observing(observer):
        logits = model(mx.array([ids]), cache=cache)[0, -1]
        mx.eval(logits)
    return [seen[id(c)] for c in cache], np.array(logits)


def numpy_h2o_sums(q, k, scale):
    """Column sums over all queries of causal softmax attention, [H_q, T], in float64."""
    n_q, n_tokens, _ = q.shape
    group = n_q // k.shape[0]
    logits = np.einsum("hqd,htd->hqt", q.astype(np.float64), np.repeat(k, group, axis=0).astype(np.float64))
    logits = np.where(np.tril(np.ones((n_tokens, n_tokens), bool)), logits * scale, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    return (probs / probs.sum(-1, keepdims=True)).sum(axis=1)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_capture_matches_numpy_from_the_models_own_qk(loaded_models, arch, monkeypatch):
    model, tok = loaded_models[arch]
    ids = tok.encode(PROMPT)
    reference, ref_logits = reference_qk(model, ids)
    monkeypatch.setattr(capture, "BLOCK_ELEMENTS", 64)  # force several query blocks per chunk
    result = capture.prefill_with_capture(model, ids, window=16, chunk_size=7)
    assert result.forward_calls == math.ceil(len(ids) / 7) and result.n_tokens == len(ids) > 16
    np.testing.assert_allclose(np.array(result.logits), ref_logits, rtol=1e-4, atol=1e-4)
    assert not result.skipped
    for obs, (q, k, scale) in zip(result.observations, reference, strict=True):
        assert (obs.n_q_heads, obs.n_kv_heads, obs.scale) == (q.shape[0], k.shape[0], scale)
        np.testing.assert_allclose(np.array(obs.keys), k, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.array(obs.window_queries), q[:, -16:], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.array(obs.h2o_sums), numpy_h2o_sums(q, k, scale), rtol=1e-4, atol=1e-5)


def test_chunked_capture_equals_one_chunk(loaded_models):
    model, tok = loaded_models["llama"]
    ids = tok.encode(PROMPT)
    one = capture.prefill_with_capture(model, ids, window=8)
    many = capture.prefill_with_capture(model, ids, window=8, chunk_size=5)
    assert one.forward_calls == 1
    for a, b in zip(one.observations, many.observations, strict=True):
        for name in ("keys", "window_queries", "h2o_sums"):
            np.testing.assert_allclose(
                np.array(getattr(a, name)), np.array(getattr(b, name)), rtol=1e-4, atol=1e-5
            )


def test_prompt_shorter_than_window_and_no_h2o(loaded_models):
    model, tok = loaded_models["qwen3"]
    ids = tok.encode("fox jumps")
    result = capture.prefill_with_capture(model, ids, window=64, h2o=False)
    obs = result.observations[0]
    assert obs.window_queries.shape == (8, len(ids), 64) and obs.h2o_sums is None


def test_non_plain_layers_are_reported_and_left_alone(loaded_models):
    model, tok = loaded_models["llama"]
    ids = tok.encode(PROMPT)
    cache = [KVCache(), RotatingKVCache(max_size=512), KVCache(), KVCache()]
    result = capture.prefill_with_capture(model, ids, cache=cache)
    assert result.observations[1] is None and "RotatingKVCache" in result.skipped[1]
    assert all(result.observations[i] is not None for i in (0, 2, 3))
    assert cache[1].offset == len(ids)


def _observer_active():
    return getattr(attention._local, "observer", None) is not None


def test_observer_removed_when_prefill_raises_or_is_cancelled(loaded_models):
    model, tok = loaded_models["llama"]
    ids = tok.encode(PROMPT)
    progress = []

    def boom(done, total):
        progress.append((done, total))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        capture.prefill_with_capture(model, ids, chunk_size=4, on_progress=boom)
    assert progress == [(4, len(ids))] and not _observer_active()
    chunks = []
    with pytest.raises(capture.Cancelled, match="after 8 of"):
        capture.prefill_with_capture(
            model,
            ids,
            chunk_size=4,
            on_progress=lambda done, total: chunks.append(done),
            should_cancel=lambda: len(chunks) == 2,
        )
    assert chunks == [4, 8] and not _observer_active()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_ids": []}, "prompt is empty"),
        ({"window": 0}, "window must be"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"prompt_ids": [1, 2, 10**6]}, "token id 1000000 is outside the model's vocabulary"),
        ({"prompt_ids": [-1, 2]}, "token id -1 is outside"),
    ],
)
def test_bad_input_is_refused(loaded_models, kwargs, message):
    model, _ = loaded_models["llama"]
    with pytest.raises(ValueError, match=message):
        capture.prefill_with_capture(model, **{"prompt_ids": [1, 2, 3], **kwargs})


@pytest.mark.parametrize("chunk_size", [5, 2048])
def test_lazy_h2o_equals_eager_capture(loaded_models, monkeypatch, chunk_size):
    """h2o="lazy" keeps queries instead of sums; ensure_h2o() gives exactly the eager sums and frees the queries
    above KEEP_PROMPT_QUERIES_BYTES (0 here)."""
    monkeypatch.setattr(defaults, "KEEP_PROMPT_QUERIES_BYTES", 0)
    model, tok = loaded_models["qwen3"]
    ids = tok.encode(PROMPT)
    monkeypatch.setattr(capture, "BLOCK_ELEMENTS", 256)  # several query blocks per chunk
    eager = capture.prefill_with_capture(model, ids, window=8, chunk_size=chunk_size, h2o=True)
    lazy = capture.prefill_with_capture(model, ids, window=8, chunk_size=chunk_size, h2o="lazy")
    for a, b in zip(eager.observations, lazy.observations, strict=True):
        assert b.h2o_sums is None and len(b.pending_queries) == -(-len(ids) // chunk_size)
        np.testing.assert_array_equal(np.array(b.ensure_h2o()), np.array(a.h2o_sums))
        assert b.pending_queries is None
        np.testing.assert_array_equal(np.array(a.window_queries), np.array(b.window_queries))


def test_h2o_ranking_computes_lazy_sums_once(loaded_models, monkeypatch):
    monkeypatch.setattr(defaults, "KEEP_PROMPT_QUERIES_BYTES", 0)
    from kvcore.methods.selection import rank

    model, tok = loaded_models["llama"]
    ids = tok.encode(PROMPT)
    eager = capture.prefill_with_capture(model, ids, window=8, h2o=True)
    lazy = capture.prefill_with_capture(model, ids, window=8, h2o="lazy")
    for method in ("h2o", "adakv-h2o"):
        a, b = rank(eager.observations, method), rank(lazy.observations, method)
        for la, lb in zip(a.layers, b.layers, strict=True):
            np.testing.assert_array_equal(la.scores, lb.scores)
            np.testing.assert_array_equal(la.order, lb.order)
    assert all(o.pending_queries is None for o in lazy.observations)


def test_bad_h2o_mode_is_refused(loaded_models):
    model, _ = loaded_models["llama"]
    with pytest.raises(ValueError, match="h2o must be"):
        capture.prefill_with_capture(model, [1, 2, 3], h2o="later")


def test_kept_logits_are_one_row_copies_not_views_of_the_chunks_logits(loaded_models):
    """Only the last position's row is kept, as a copy: a slice would hold the chunk's [chunk, vocab] buffer."""
    model, tok = loaded_models["llama"]
    ids = (tok.encode(PROMPT) * 4)[:97]
    vocab, chunk = model.args.vocab_size, 48  # the body: 2 chunks of 48, whose last one's logits are kept
    mx.synchronize()
    mx.clear_cache()
    resident = mx.get_active_memory()
    result = capture.prefill_with_capture(model, ids, window=8, chunk_size=chunk, h2o=False, hold_last=True)
    assert len(ids) == 97 and result.forward_calls == 3 and result.before_last.forward_calls == 2
    logits, before = result.logits, result.before_last.logits
    assert logits.shape == before.shape == (vocab,)
    del result
    mx.clear_cache()
    held = mx.get_active_memory() - resident
    # The two rows (float32 at most; room for two more), never the body chunk's logits buffer (48 rows).
    assert 0 < held <= 4 * vocab * 4, f"{held} bytes held for two logits rows of {vocab}"


def test_the_window_is_kept_in_the_models_dtype_and_scores_as_float32(model_dirs):
    """A bf16 model's window queries stay bf16 (half the memory of float32 copies, held by the result and
    before_last each); snapkv scores them exactly as it scores their float32 copy."""
    import mlx_lm

    from kvcore.methods.selection import rank

    model, tok = mlx_lm.load(str(model_dirs["llama"]))
    model.set_dtype(mx.bfloat16)
    result = capture.prefill_with_capture(
        model, tok.encode(PROMPT * 3), window=64, chunk_size=7, hold_last=True
    )
    for r in (result, result.before_last):
        assert all(o.window_queries.dtype == mx.bfloat16 for o in r.observations)
    as_float = [
        capture.LayerObservation(
            o.keys, o.window_queries.astype(mx.float32), o.h2o_sums, o.n_q_heads, o.n_kv_heads, o.scale
        )
        for o in result.observations
    ]
    for method in ("snapkv", "tova"):
        for a, b in zip(rank(result.observations, method).layers, rank(as_float, method).layers, strict=True):
            np.testing.assert_array_equal(a.scores, b.scores)


def test_a_long_prompts_chunks_shrink_so_no_layer_holds_more_than_max_scores(loaded_models):
    """Past 2^31 attention scores MLX's CPU attention segfaults: later chunks (more keys) are shortened so query
    heads x chunk x keys stays under max_scores, with the same cache and observations."""
    model, tok = loaded_models["llama"]
    ids = tok.encode(PROMPT)
    heads = model.args.num_attention_heads
    limit = heads * 6 * len(ids) // 2
    fixed = capture.prefill_with_capture(model, ids, window=8, chunk_size=6)
    bounded = capture.prefill_with_capture(model, ids, window=8, chunk_size=6, max_scores=limit)
    spans = capture._spans(len(ids), 6, heads, limit)
    assert all(heads * (b - a) * b <= limit for a, b in spans), "no chunk holds more scores than the limit"
    assert spans[-1][1] == len(ids) and len(spans) > -(-len(ids) // 6), "later chunks are shorter"
    assert bounded.forward_calls == len(spans)
    for a, b in zip(fixed.observations, bounded.observations, strict=True):
        for name in ("keys", "window_queries", "h2o_sums"):
            np.testing.assert_allclose(
                np.array(getattr(a, name)), np.array(getattr(b, name)), rtol=1e-4, atol=1e-5
            )
