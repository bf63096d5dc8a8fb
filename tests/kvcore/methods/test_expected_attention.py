"""expected_attention against a float64 NumPy reading of DESIGN.md on real llama / qwen3 models.

The oracle owes nothing to kvcore: pre-RoPE queries are recomputed in NumPy from each layer's own q_proj weights
(and qwen3's q_norm) applied to the layer's input, the rotation matrices are written out from RoPE frequencies
derived from the config (llama3 scaling included), and keys / values come from a plain mlx-lm prefill.
Several models are prefilled in one process and scored after one another, so per-model state would show.
"""

from __future__ import annotations

import gc
import math

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from kvcore import methods
from kvcore.capture import prefill as capture
from kvcore.engine.session import CompressionConfig, Session
from kvcore.methods import selection
from tests.kvcore.methods.helpers import keep, n_kept
from tests.model_factory import ARCHS, build_model

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    path = build_model(tmp_path_factory.mktemp("llama3"), "llama", seed=3, rope_scaling=LLAMA3_SCALING)
    return mlx_lm.load(str(path))


def inv_freqs(config: dict) -> np.ndarray:
    """Rotation speed (radians per position) of each dimension pair, float64, from the config alone."""
    head_dim, base = config["head_dim"], config["rope_theta"]
    inv = 1.0 / base ** (np.arange(0, head_dim, 2) / head_dim)
    scaling = config.get("rope_scaling")
    if not scaling:
        return inv
    factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
    low_wl, high_wl = old / scaling["low_freq_factor"], old / scaling["high_freq_factor"]
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > low_wl, inv / factor, inv)
    smooth = (old / wavelen - scaling["low_freq_factor"]) / (
        scaling["high_freq_factor"] - scaling["low_freq_factor"]
    )
    medium = (wavelen >= high_wl) & (wavelen <= low_wl)
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def rope_matrix(inv: np.ndarray, position: int) -> np.ndarray:
    """The explicit [D, D] rotation of non-traditional RoPE: dimension i pairs with i + D/2."""
    half = inv.size
    cos, sin = np.cos(position * inv), np.sin(position * inv)
    m = np.zeros((2 * half, 2 * half))
    i = np.arange(half)
    m[i, i], m[i, i + half], m[i + half, i], m[i + half, i + half] = cos, -sin, sin, cos
    return m


def reference(model, config: dict, ids: list[int]):
    """Per layer: pre-RoPE queries [H_q, T, D] (NumPy from the weights), cached keys and values (float64)."""
    inner = model.model
    h = inner.embed_tokens(mx.array([ids]))
    cache = make_prompt_cache(model)
    out = []
    for layer, layer_cache in zip(inner.layers, cache, strict=True):
        x = np.array(layer.input_layernorm(h)[0], dtype=np.float64)  # [T, hidden]
        attn = layer.self_attn
        q = x @ np.array(attn.q_proj.weight, dtype=np.float64).T
        q = q.reshape(len(ids), config["num_attention_heads"], config["head_dim"]).transpose(1, 0, 2)
        if "q_norm" in attn:
            w = np.array(attn.q_norm.weight, dtype=np.float64)
            q = q / np.sqrt((q * q).mean(-1, keepdims=True) + config["rms_norm_eps"]) * w
        h = layer(h, mask="causal", cache=layer_cache)
        mx.eval(h)
        k, v = (
            np.array(a[0, :, : len(ids)], dtype=np.float64) for a in (layer_cache.keys, layer_cache.values)
        )
        out.append((q, k, v))
    return out


def oracle_scores(q, k, v, inv, n_sink: int) -> np.ndarray:
    """DESIGN.md's expected_attention scores [H_kv, T - n_sink] of the non-sink positions, float64."""
    n_q, n_tokens, d = q.shape
    n_kv = k.shape[0]
    rows = q[:, n_sink:]
    mu = rows.mean(axis=1)
    centred = rows - mu[:, None]
    cov = np.einsum("hti,htj->hij", centred, centred) / rows.shape[1]
    r_bar = np.mean([rope_matrix(inv, p) for p in range(n_tokens, n_tokens + 512)], axis=0)
    mu, cov = mu @ r_bar.T, r_bar @ cov @ r_bar.T
    keys = np.repeat(k[:, n_sink:], n_q // n_kv, axis=0)
    logits = np.einsum("htd,hd->ht", keys, mu) / math.sqrt(d)
    logits += np.einsum("hti,hij,htj->ht", keys, cov, keys) / (2 * d)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return p.reshape(n_kv, n_q // n_kv, -1).mean(axis=1) * np.linalg.norm(v[:, n_sink:], axis=-1)


def _ids(n: int, seed: int, model) -> list[int]:
    """Random prompt ids inside the model's vocabulary (an id past it makes MLX read memory past the table)."""
    return [int(t) for t in np.random.default_rng(seed).integers(1, model.args.vocab_size, n)]


def _check(result, model, config, ids, n_sink):
    """kvcore's scores and kept positions for `result` equal the oracle's in every layer and kv-head."""
    inv = inv_freqs(config)
    ranking = selection.rank(result.observations, methods.get("expected_attention", n_sink=n_sink))
    expected = [oracle_scores(q, k, v, inv, n_sink) for q, k, v in reference(model, config, ids)]
    for layer, want in zip(ranking.layers, expected, strict=True):
        np.testing.assert_allclose(layer.scores[:, n_sink:], want, rtol=2e-4, atol=1e-7)
        assert (layer.scores[:, :n_sink] > layer.scores[:, n_sink:].max()).all()
    for ratio in (0.1, 0.3, 0.6):
        n = n_kept(len(ids), ratio)
        for layer, want in zip(selection.select(ranking, ratio), expected, strict=True):
            scores = np.concatenate([np.zeros((want.shape[0], n_sink)), want], axis=1)
            top = np.stack([keep(row, n, list(range(n_sink))) for row in scores])
            np.testing.assert_array_equal(layer, top, err_msg=f"ratio {ratio}")
    return ranking


@pytest.mark.parametrize("n_sink", [4, 0, 20])
def test_scores_equal_numpy_on_several_models_in_one_process(loaded_models, model_dirs, llama3, n_sink):
    """Three models prefilled one after another (chunks of 37 split the 64 kept-apart queries), then scored."""
    models = {
        "llama": (loaded_models["llama"][0], dict(ARCHS["llama"])),
        "qwen3": (loaded_models["qwen3"][0], dict(ARCHS["qwen3"])),
        "llama3": (llama3[0], dict(ARCHS["llama"], rope_scaling=LLAMA3_SCALING)),
    }
    prompts = {name: _ids(130 + 11 * i, i, models[name][0]) for i, name in enumerate(models)}
    captured = {
        name: capture.prefill_with_capture(model, prompts[name], chunk_size=37, hold_last=True)
        for name, (model, _) in models.items()
    }
    for name, (model, config) in models.items():
        ids = prompts[name]
        _check(captured[name], model, config, ids, n_sink)
        _check(captured[name].before_last, model, config, ids[:-1], n_sink)  # the "mlx-lm" schedule: T − 1


def test_llama3_scaling_changes_the_scores(llama3):
    """The oracle is sensitive to the rope scaling, so matching it means the model's own frequencies were used."""
    model, _ = llama3
    config = dict(ARCHS["llama"], rope_scaling=LLAMA3_SCALING)
    ids = _ids(150, 7, model)
    q, k, v = reference(model, config, ids)[1]
    scaled = oracle_scores(q, k, v, inv_freqs(config), 4)
    plain = oracle_scores(q, k, v, inv_freqs(ARCHS["llama"]), 4)
    assert np.abs(scaled - plain).max() > 1e-2 * np.abs(scaled).max()


def test_repeated_prefills_give_identical_scores(loaded_models):
    """Prefilling another model in between changes nothing: no state survives a capture."""
    llama, qwen = loaded_models["llama"][0], loaded_models["qwen3"][0]
    ids = _ids(120, 9, llama)
    first = capture.prefill_with_capture(llama, ids, chunk_size=50)
    capture.prefill_with_capture(qwen, _ids(90, 10, qwen), chunk_size=50)
    second = capture.prefill_with_capture(llama, ids, chunk_size=50)
    a, b = (selection.rank(r.observations, "expected_attention") for r in (first, second))
    for x, y in zip(a.layers, b.layers, strict=True):
        np.testing.assert_array_equal(x.scores, y.scores)
        assert np.isfinite(x.scores).all()


def test_adakv_wraps_it(loaded_models):
    model, _ = loaded_models["llama"]
    result = capture.prefill_with_capture(model, _ids(140, 11, model))
    plain = selection.rank(result.observations, "expected_attention")
    ada = selection.rank(result.observations, "adakv-expected_attention")
    for x, y in zip(plain.layers, ada.layers, strict=True):
        np.testing.assert_array_equal(x.scores, y.scores)
    kept = selection.select(ada, 0.25)
    n = n_kept(140, 0.25)
    for layer in kept:
        assert sum(len(h) for h in layer) == len(layer) * n
        assert all(set(range(4)) <= set(h.tolist()) for h in layer)


def test_without_statistics_it_is_refused_with_the_fix(loaded_models):
    model, _ = loaded_models["qwen3"]
    result = capture.prefill_with_capture(model, _ids(40, 12, model), query_stats=False)
    assert all(o.query_stats is None for o in result.observations)
    with pytest.raises(ValueError, match="query_stats=True"):
        selection.rank(result.observations, "expected_attention")


def test_n_sink_above_the_kept_queries_is_refused():
    with pytest.raises(ValueError, match="n_sink up to 64"):
        CompressionConfig("adakv-expected_attention", n_sink=65)
    assert CompressionConfig("streaming_llm", n_sink=65).n_sink == 65


def test_a_freed_model_copy_changes_nothing(model_dirs):
    """A model copy prefilled, extended, freed and collected before another copy is loaded changes nothing: two
    plain mlx-lm prefills agree bit for bit, so do two captures of the new copy, scores included, and captures equal
    the plain prefill to rounding. (Prompt ids past the vocabulary once made them differ by ~3 in the keys: they read
    recycled memory past the embedding table.)"""
    other = Session.load(str(model_dirs["llama"]))
    other.prefill(_ids(60, 2, other.model), n_tokens=3)
    other.extend(2)
    del other
    gc.collect()
    model, _ = mlx_lm.load(str(model_dirs["llama"]))
    ids = _ids(141, 1, model)
    plain = []
    for _ in range(2):
        cache = make_prompt_cache(model)
        model(mx.array([ids]), cache=cache)
        plain.append([np.array(c.keys[0, :, : len(ids)]) for c in cache])
    first, second = (capture.prefill_with_capture(model, ids, chunk_size=37) for _ in range(2))
    for a, b, once, again in zip(first.observations, second.observations, *plain, strict=True):
        np.testing.assert_array_equal(np.array(a.keys), np.array(b.keys))
        np.testing.assert_array_equal(once, again)
        # Chunks of 37 against one pass: an optimized BLAS may round the projections of other row counts differently
        # (OpenBLAS on an AMD EPYC: 1e-6), far below what the stray reads gave.
        np.testing.assert_allclose(np.array(a.keys), once, rtol=0, atol=1e-5)
    a, b = (selection.rank(r.observations, "expected_attention") for r in (first, second))
    for x, y in zip(a.layers, b.layers, strict=True):
        np.testing.assert_array_equal(x.scores, y.scores)
