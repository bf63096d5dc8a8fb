"""kvzip against a NumPy reading of kvpress's definition, on a tiny real llama.

The reference runs the context and one reconstruction input as ONE sequence through a fresh cache (no replay, no
copy), takes every layer's queries and keys from the attention calls, and computes in NumPy the softmax over the
sinks, the chunk and the reconstruction keys, the max over the group's query heads and the reconstruction queries.
"""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from kvcore.engine.session import CompressionConfig, Session
from kvcore.methods import kvzip as kvzip_module
from kvcore.methods import selection
from kvcore.model import attention
from tests.attention_inputs import input_norm_outputs

PROMPT = "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=1, chat_template=False)
    return s


def _one_pass(model, ids, n_context):
    """Per layer: (queries [H_q, N, D], keys [H_kv, T + N, D], values, scale, attention input norms [N]) of the
    last N tokens of one forward pass over `ids` from an empty cache."""
    seen = []
    attention.install(model)

    def record(q, k, v, c, s, m, latent=False):
        seen.append((q, k, v, s))

    with input_norm_outputs(model) as inputs, attention.observing(record):
        model(mx.array([ids]), cache=make_prompt_cache(model))
    out = []
    for (q, k, v, s), x in zip(seen, inputs, strict=True):
        mx.eval(q, k, v, x)
        row_norms = np.linalg.norm(np.array(x[0, n_context:], np.float64), axis=-1)
        q = np.array(q[0, :, n_context:], np.float64)
        out.append((q, np.array(k[0], np.float64), np.array(v[0], np.float64), s, row_norms))
    return out


def reference_scores(model, ids, start, end, n_sink, input_ids, plus=False):
    """[L][H_kv, end - start] scores of context[start:end] from one reconstruction input."""
    n_context = len(ids)
    out = []
    for layer, (q, k, v, scale, row_norms) in enumerate(_one_pass(model, ids + input_ids, n_context)):
        n_q, n_new, _ = q.shape
        n_kv = k.shape[0]
        group = n_q // n_kv
        sink = min(n_sink, start)
        cols = list(range(sink)) + list(range(start, end)) + list(range(n_context, n_context + n_new))
        scores = np.zeros((n_kv, end - start))
        for h in range(n_q):
            kv = h // group
            logits = q[h] @ k[kv, cols].T * scale
            n_ctx = sink + end - start
            causal = np.arange(n_new)[None, :] > np.arange(n_new)[:, None]
            logits[:, n_ctx:][causal] = -np.inf
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            p = p[:, sink:n_ctx]
            if plus:
                w = np.array(model.layers[layer].self_attn.o_proj.weight, np.float64)
                d = q.shape[-1]
                wov = np.linalg.norm(v[kv, start:end] @ w[:, h * d : (h + 1) * d].T, axis=-1)
                p = p / row_norms[:, None] * wov[None, :]
            scores[kv] = np.maximum(scores[kv], p.max(0))
        out.append(scores)
    return out


def _observed_scores(session, method):
    session.ranking(CompressionConfig("kvzip", 0.5, params=method.values()))
    return [o.reconstruction[method.reconstruction_key] for o in session._observed("paper").observations]


@pytest.mark.parametrize("chunk_size", [2048, 13])
def test_kvzip_scores_match_numpy(session, chunk_size):
    method = kvzip_module.KVzip(chunk_size=chunk_size)
    ours = _observed_scores(session, method)
    ids = session.prompt_ids
    _, suffix = kvzip_module.template_parts(session.tokenizer)
    inputs = kvzip_module.reconstruction_inputs(session.tokenizer, ids, 0, suffix, chunk_size)
    assert len(inputs) == (1 if chunk_size > len(ids) else -(-len(ids) // chunk_size))
    for start, end, input_ids in inputs:
        want = reference_scores(session.model, ids, start, end, method.n_sink, input_ids)
        for layer, w in enumerate(want):
            np.testing.assert_allclose(np.array(ours[layer][:, start:end]), w, rtol=2e-4, atol=1e-6)


def test_kvzip_plus_matches_numpy(session):
    method = kvzip_module.KVzip(kvzip_plus_normalization=1)
    ours = _observed_scores(session, method)
    ids = session.prompt_ids
    _, suffix = kvzip_module.template_parts(session.tokenizer)
    ((start, end, input_ids),) = kvzip_module.reconstruction_inputs(session.tokenizer, ids, 0, suffix, 2048)
    want = reference_scores(session.model, ids, start, end, method.n_sink, input_ids, plus=True)
    for layer, w in enumerate(want):
        np.testing.assert_allclose(np.array(ours[layer]), w, rtol=2e-4, atol=1e-7)


@pytest.mark.parametrize("layerwise", [0, 1])
@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_kvzip_evicts_the_lowest_scores_across_layers_and_heads(session, layerwise, ratio):
    config = CompressionConfig("kvzip", ratio, params={"layerwise": layerwise})
    state = session.compress(config)
    scores = np.stack([layer.scores for layer in state.ranking.layers]).astype(np.float64)  # [L, H, T]
    scores[..., :4] = np.inf  # the sinks
    groups = [scores[i : i + 1] for i in range(len(scores))] if layerwise else [scores]
    want = []
    for g in groups:
        flat = g.ravel()
        keep = np.ones(flat.size, bool)
        keep[np.argsort(flat, kind="stable")[: int(flat.size * (1.0 - ratio))]] = False
        want.append(keep.reshape(g.shape))
    np.testing.assert_array_equal(state.kept, np.concatenate(want))
    counts = state.kept.sum(axis=-1)
    if layerwise:
        assert len(set(counts.sum(axis=1).tolist())) == 1
    assert state.kept[..., :4].all()
    rebuilt = selection.device_select(
        state.ranking, state.selection
    )  # what a GPU session sends: the same rows
    for layer, heads in zip(rebuilt, state.selection, strict=True):
        for h, kept in enumerate(heads):
            np.testing.assert_array_equal(np.array(layer[h, : kept.size]), kept)
    assert state.bytes_compressed < state.bytes_dense


def test_kvzip_leaves_the_context_cache_as_it_was(session):
    before = [np.array(c.keys[0, :, : c.offset]) for c in session._observed("paper").cache]
    session.ranking(CompressionConfig("kvzip", 0.25, params={"chunk_size": 7}))
    after = [np.array(c.keys[0, :, : c.offset]) for c in session._observed("paper").cache]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_kvzip_without_its_pass_says_how(session):
    obs = session._observed("paper").observations
    with pytest.raises(ValueError, match="reconstruction pass"):
        selection.rank(obs, kvzip_module.KVzip(chunk_size=5))


def test_kvzip_keeps_the_same_positions_when_its_pass_runs_again(session):
    config = CompressionConfig("kvzip", 0.3)
    first = session.compress(config).kept
    for obs in session._observed("paper").observations:
        obs.reconstruction.clear()
    session._rankings.clear()
    np.testing.assert_array_equal(session.compress(config).kept, first)


def test_kvzip_under_a_chat_template_skips_its_opening_as_kvpress(model_dirs, tmp_path):
    from tests.model_factory import with_chat_template

    s = Session.load(str(with_chat_template(model_dirs["llama"], tmp_path / "llama-chat")))
    s.prefill(PROMPT, n_tokens=1, chat_template=True)
    prefix, suffix = kvzip_module.template_parts(s.tokenizer)
    assert s.chat_template_applied and prefix > 0
    assert suffix == list(s.tokenizer.encode("<|endoftext|>\n<|assistant|>\n", add_special_tokens=False))
    scores = s.ranking(CompressionConfig("kvzip", 0.5)).layers[0].scores
    assert (scores[:, :prefix] == 0).all() and (scores[:, prefix:] > 0).all()


def test_kvzip_scores_the_same_in_blocks_of_queries(monkeypatch):
    rng = np.random.default_rng(0)
    q = mx.array(rng.standard_normal((4, 9, 8)).astype(np.float32))
    k = mx.array(rng.standard_normal((2, 30 + 9, 8)).astype(np.float32))
    whole = kvzip_module.chunk_scores(q, k, 10, 30, 4, 0.3, mx.ones(9) * 2, mx.ones((2, 2, 20)) * 3)
    monkeypatch.setattr(kvzip_module, "BLOCK_ELEMENTS", 4 * 33 * 2)  # two queries a block
    blocked = kvzip_module.chunk_scores(q, k, 10, 30, 4, 0.3, mx.ones(9) * 2, mx.ones((2, 2, 20)) * 3)
    np.testing.assert_allclose(np.array(blocked), np.array(whole), rtol=1e-6)
