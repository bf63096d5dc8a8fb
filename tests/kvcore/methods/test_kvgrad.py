"""kvgrad against a float64 NumPy reading of kvpress's KVgradPress, on a tiny real llama.

The reference is the tiny llama re-implemented in NumPy (float64, its own weights): one pass over the context and
a reconstruction input as ONE sequence gives every layer's queries, keys, values and attention outputs. The
gradient ∂Φ/∂a (Φ = Σ_p ‖h_p‖² over the reconstruction tokens' last-layer outputs, a a layer's attention output)
is checked by central differences of that NumPy model, every hidden channel of the last reconstruction tokens of
every layer; the scores by the definition max over p and the group of A · ‖W_o,g·v‖ · ‖∂Φ/∂a_p‖.
"""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kvcore import methods
from kvcore.capture import reconstruction
from kvcore.cli.main import main
from kvcore.engine.session import CompressionConfig, Session
from kvcore.methods import kvgrad as kvgrad_module
from kvcore.methods import kvzip as kvzip_module
from tests.kvcore.methods.test_kvzip import PROMPT


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=1, chat_template=False)
    return s


class NumpyLlama:
    """mlx-lm's llama (RMSNorm, rotate-half RoPE, GQA attention, SwiGLU) in float64; batched over rows of x."""

    def __init__(self, model):
        self.w = {k: np.array(v, np.float64) for k, v in tree_flatten(model.parameters())}
        a = model.args
        self.n_layers, self.n_heads, self.n_kv = (
            a.num_hidden_layers,
            a.num_attention_heads,
            a.num_key_value_heads,
        )
        self.head_dim, self.eps, self.theta = a.head_dim, a.rms_norm_eps, a.rope_theta

    def _p(self, layer, name):
        return self.w[f"model.layers.{layer}.{name}.weight"]

    def _norm(self, x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * weight

    def _rope(self, x, positions):
        half = self.head_dim // 2
        angle = positions[:, None] * self.theta ** (-np.arange(half) * 2 / self.head_dim)
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate(
            [x1 * np.cos(angle) - x2 * np.sin(angle), x1 * np.sin(angle) + x2 * np.cos(angle)], -1
        )

    def attention(self, layer, x, start, past=None):
        """x [B, S, hidden] at positions start…, after `past` (k, v [1, H_kv, start, D]): (output, q, k, v) of these
        positions. The group's query heads share their kv-head by broadcasting (no copy per row of x)."""
        b, s, _ = x.shape
        positions = np.arange(start, start + s, dtype=np.float64)
        q, k, v = (
            (x @ self._p(layer, f"self_attn.{name}").T).reshape(b, s, n, -1).transpose(0, 2, 1, 3)
            for name, n in (("q_proj", self.n_heads), ("k_proj", self.n_kv), ("v_proj", self.n_kv))
        )
        q, k = self._rope(q, positions), self._rope(k, positions)
        group = self.n_heads // self.n_kv
        grouped = q.reshape(b, self.n_kv, group, s, -1) * self.head_dim**-0.5
        past_k, past_v = past if past is not None else (k[:1, :, :0], v[:1, :, :0])
        logits = np.concatenate(
            [grouped @ past_k[:, :, None].swapaxes(-1, -2), grouped @ k[:, :, None].swapaxes(-1, -2)], axis=-1
        )  # [B, H_kv, group, S, P + S]
        n_past = past_k.shape[2]
        logits[..., np.arange(n_past + s)[None, :] > n_past + np.arange(s)[:, None]] = -np.inf
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        mixed = (
            p[..., :n_past] @ past_v[:, :, None] + p[..., n_past:] @ v[:, :, None]
        )  # [B, H_kv, group, S, D]
        out = mixed.reshape(b, self.n_heads, s, -1).transpose(0, 2, 1, 3).reshape(b, s, -1)
        return out @ self._p(layer, "self_attn.o_proj").T, q, k, v

    def mlp(self, layer, x):
        gate = x @ self._p(layer, "mlp.gate_proj").T
        up = x @ self._p(layer, "mlp.up_proj").T
        return (gate / (1 + np.exp(-gate)) * up) @ self._p(layer, "mlp.down_proj").T

    def run(self, ids):
        """Per layer (residual in, attention output, q, k, v) of one pass over `ids`, and the last layer's output."""
        h = self.w["model.embed_tokens.weight"][np.array(ids)][None]
        parts = []
        for layer in range(self.n_layers):
            a, q, k, v = self.attention(layer, self._norm(h, self._p(layer, "input_layernorm")), 0)
            parts.append((h, a, q, k, v))
            h = h + a
            h = h + self.mlp(layer, self._norm(h, self._p(layer, "post_attention_layernorm")))
        return parts, h

    def phi_from(self, layer, start, h, parts):
        """Σ‖last-layer output‖² over positions start… when the residual after `layer`'s attention there is h
        [B, S, hidden] (positions before `start` as in `parts`)."""
        h = h + self.mlp(layer, self._norm(h, self._p(layer, "post_attention_layernorm")))
        for later in range(layer + 1, self.n_layers):
            _, _, _, k, v = parts[later]
            past = (k[:, :, :start], v[:, :, :start])
            a, *_ = self.attention(later, self._norm(h, self._p(later, "input_layernorm")), start, past)
            h = h + a
            h = h + self.mlp(later, self._norm(h, self._p(later, "post_attention_layernorm")))
        return (h * h).sum(axis=(1, 2))


def numpy_gradient_norms(ref, parts, n_tokens, n_last, eps=1e-5):
    """[L, n_last]: ‖∂Φ/∂a_p‖ at the last n_last positions by central differences of every hidden channel."""
    start = n_tokens - n_last
    out = []
    for layer, (h_in, a, *_) in enumerate(parts):
        base = (h_in + a)[:, start:]  # [1, n_last, hidden]
        width = base.shape[-1]
        shifts = np.zeros((2, n_last, width, n_last, width))
        for p in range(n_last):
            shifts[0, p, :, p] = np.eye(width) * eps
            shifts[1, p, :, p] = -np.eye(width) * eps
        phi = ref.phi_from(layer, start, base + shifts.reshape(-1, n_last, width), parts).reshape(
            2, n_last, width
        )
        grad = (phi[0] - phi[1]) / (2 * eps)  # [n_last, hidden]
        out.append(np.linalg.norm(grad, axis=-1))
    return np.array(out)


def _replay_norms(session, input_ids):
    """{layer: [N]} ‖∂Φ/∂a‖ from reconstruction.replay_gradients over the session's context cache."""
    found = {}

    def observe(layer, queries, keys, values, scale, norms):
        found[layer] = norms
        return [norms]

    reconstruction.replay_gradients(session.model, session._observed("paper").cache, input_ids, observe)
    return {layer: np.array(n, np.float64) for layer, n in found.items()}


def test_replay_gradients_match_finite_differences(session):
    ids = session.prompt_ids
    _, suffix = kvzip_module.template_parts(session.tokenizer)
    ((_, _, input_ids),) = kvzip_module.reconstruction_inputs(session.tokenizer, ids, 0, suffix, 512)
    ref = NumpyLlama(session.model)
    parts, last = ref.run(ids + input_ids)
    logits = ref._norm(last, ref.w["model.norm.weight"]) @ ref.w["model.embed_tokens.weight"].T
    theirs = session.model(mx.array([ids + input_ids]))  # the reference is the same model
    np.testing.assert_allclose(logits[0], np.array(theirs[0], np.float64), rtol=1e-3, atol=1e-4)
    ours = _replay_norms(session, input_ids)
    n_last = 2
    want = numpy_gradient_norms(ref, parts, len(ids) + len(input_ids), n_last)
    for layer in range(ref.n_layers):
        np.testing.assert_allclose(ours[layer][-n_last:], want[layer], rtol=2e-4)
    assert all(ours[layer].shape == (len(input_ids),) and (ours[layer] > 0).all() for layer in ours)


def reference_scores(ref, ids, start, end, n_sink, input_ids, gradient_norms):
    """[L][H_kv, end - start]: max over reconstruction queries and the group of A · ‖W_o,g·v‖ · ‖∂Φ/∂a‖."""
    n_context = len(ids)
    parts, _ = ref.run(ids + input_ids)
    out = []
    for layer, (_, _, q, k, v) in enumerate(parts):
        q, k, v = q[0, :, n_context:], k[0], v[0]
        n_q, n_new, d = q.shape
        group = n_q // k.shape[0]
        sink = min(n_sink, start)
        cols = list(range(sink)) + list(range(start, end)) + list(range(n_context, n_context + n_new))
        n_ctx = sink + end - start
        w_o = ref._p(layer, "self_attn.o_proj")
        scores = np.zeros((k.shape[0], end - start))
        for h in range(n_q):
            kv = h // group
            logits = q[h] @ k[kv, cols].T * d**-0.5
            logits[:, n_ctx:][np.arange(n_new)[None, :] > np.arange(n_new)[:, None]] = -np.inf
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p = (p / p.sum(-1, keepdims=True))[:, sink:n_ctx]
            wov = np.linalg.norm(v[kv, start:end] @ w_o[:, h * d : (h + 1) * d].T, axis=-1)
            s = p * wov[None, :] * gradient_norms[layer][:, None]
            scores[kv] = np.maximum(scores[kv], s.max(0))
        out.append(scores)
    return out


@pytest.mark.parametrize("chunk_size", [512, 13])
def test_kvgrad_scores_match_numpy(session, chunk_size):
    method = kvgrad_module.KVgrad(chunk_size=chunk_size)
    session.ranking(CompressionConfig("kvgrad", 0.5, params=method.values()))
    ours = [o.reconstruction[method.reconstruction_key] for o in session._observed("paper").observations]
    ids = session.prompt_ids
    _, suffix = kvzip_module.template_parts(session.tokenizer)
    inputs = kvzip_module.reconstruction_inputs(session.tokenizer, ids, 0, suffix, chunk_size)
    assert len(inputs) == -(-len(ids) // chunk_size)
    ref = NumpyLlama(session.model)
    for start, end, input_ids in inputs:
        norms = _replay_norms(session, input_ids)  # checked against finite differences above
        want = reference_scores(ref, ids, start, end, method.n_sink, input_ids, norms)
        for layer, w in enumerate(want):
            np.testing.assert_allclose(np.array(ours[layer][:, start:end]), w, rtol=5e-4, atol=1e-7)


def test_kvgrad_keeps_kvpress_defaults_and_the_context_cache(session):
    method = methods.get("kvgrad")
    assert method.values() == {"n_sink": 4, "layerwise": 0, "chunk_size": 512}
    assert method.budget == "global" and method.needs_reconstruction
    before = [np.array(c.keys[0, :, : c.offset]) for c in session._observed("paper").cache]
    state = session.compress(CompressionConfig("kvgrad", 0.25, params={"chunk_size": 9}))
    after = [np.array(c.keys[0, :, : c.offset]) for c in session._observed("paper").cache]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert state.kept[..., :4].all() and state.kept.sum() < state.kept.size


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"chunk_size": 0}, "chunk_size must be an integer >= 1"),
        (
            {"kvzip_plus_normalization": 1},
            r"kvgrad has no parameter kvzip_plus_normalization \(its parameters",
        ),
    ],
)
def test_kvgrad_bad_parameters_name_the_fix(params, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig("kvgrad", 0.5, params=params)


def test_kvlens_lists_and_compresses_with_kvgrad(model_dirs, prompt_file, tmp_path, capsys):
    assert main(["methods"]) == 0
    assert f"kvgrad: {methods.describe('kvgrad')}" in capsys.readouterr().out
    positions = tmp_path / "kept.json"
    model, prompt = str(model_dirs["llama"]), str(prompt_file)
    argv = ["compress", "--model", model, "--prompt-file", prompt, "--tokens", "1", "--method", "kvgrad"]
    argv += ["--ratio", "0.25", "--positions", str(positions), "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["method"] == "kvgrad"
    kept = json.loads(positions.read_text())
    slots = sum(len(layer["heads"]) for layer in kept["layers"]) * len(kept["prompt_tokens"])
    n_kept = sum(len(h) for layer in kept["layers"] for h in layer["heads"])
    assert n_kept == slots - int(slots * 0.75)  # kvpress's global rule: int(N · compression) evicted
