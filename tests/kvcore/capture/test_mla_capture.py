"""Capture on deepseek_v3-shaped MLA models (bf16 and 4-bit weights): the scores are mlx-lm's own attention.

Everything is recomputed here in float64 NumPy from the layer weights, in mlx-lm's multi-token form (q_nope
against per-head keys `latent @ embed_q`, plus the RoPE part): the observed keys are the cached latent and RoPE
rows, the window attention and h2o sums equal that attention's weights over latent positions, and h2o / tova
score them summed over every query head (one shared kv-head). Then `kvlens compress` runs on such a model, and
a saved session scores as the live one.
"""

from __future__ import annotations

import csv
import json

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.models.base import create_attention_mask

from kvcore import methods
from kvcore.capture import prefill as capture
from kvcore.cli.main import main
from kvcore.engine.session import CompressionConfig, Session
from kvcore.engine.session_file import open_session, save_session
from kvcore.methods.base import window_attention
from kvcore.model import loading
from tests.kvcore.conftest import PROMPT
from tests.model_factory import ARCHS, build_model

WINDOW = 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mla")
    bf16 = build_model(root / "bf16", "deepseek_v3", dtype="bfloat16")
    mlx_lm.convert(str(bf16), str(root / "q4"), quantize=True, q_bits=4, q_group_size=32)
    return {"bf16": bf16, "q4": root / "q4"}


def _dense(module) -> np.ndarray:
    """A (quantized) Linear's or MultiLinear's weight as float64."""
    w = module.weight
    if "scales" in module:
        w = mx.dequantize(
            w, module.scales, module.get("biases"), group_size=module.group_size, bits=module.bits
        )
    return np.array(w.astype(mx.float32), np.float64)


def _rope(x: np.ndarray, base: float) -> np.ndarray:
    """mlx's traditional RoPE (adjacent pairs rotated) at positions 0..T-1 along axis -2."""
    d = x.shape[-1]
    angle = np.arange(x.shape[-2])[:, None] * base ** (-np.arange(0, d, 2) / d)[None]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = (
        x0 * np.cos(angle) - x1 * np.sin(angle),
        x0 * np.sin(angle) + x1 * np.cos(angle),
    )
    return out


def _numpy_attention(model, ids) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer: (causal attention weights [H, T, T], keys [T, r+p] = [latent, k_pe]) from the layer weights."""
    config = ARCHS["deepseek_v3"]
    names = ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "kv_lora_rank")
    H, n, p, r = (config[k] for k in names)
    base = model.args.rope_theta
    h = model.model.embed_tokens(mx.array([ids]))
    mask = create_attention_mask(h, None, return_array=True)
    out = []
    for layer in model.model.layers:
        attn = layer.self_attn
        x = np.array(layer.input_layernorm(h)[0].astype(mx.float32), np.float64)  # [T, hidden]
        T = x.shape[0]
        q = (x @ _dense(attn.q_proj).T).reshape(T, H, n + p).transpose(1, 0, 2)
        q_nope, q_pe = q[..., :n], _rope(q[..., n:], base)
        kv = x @ _dense(attn.kv_a_proj_with_mqa).T
        raw, k_pe = kv[:, :r], _rope(kv[:, r:], base)
        gain = np.array(attn.kv_a_layernorm.weight.astype(mx.float32), np.float64)
        latent = raw / np.sqrt((raw * raw).mean(-1, keepdims=True) + 1e-6) * gain
        # mlx-lm's multi-token form: per-head keys embed_q(latent, transpose=False), the RoPE part added.
        k_nope = np.einsum("tr,hrn->htn", latent, _dense(attn.embed_q))
        scale = (n + p) ** -0.5
        logits = (np.einsum("hqn,htn->hqt", q_nope, k_nope) + np.einsum("hqp,tp->hqt", q_pe, k_pe)) * scale
        logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        out.append((weights / weights.sum(-1, keepdims=True), np.concatenate([latent, k_pe], axis=-1)))
        h = layer(h, mask, cache=None)
    return out


@pytest.mark.parametrize("weights", ["bf16", "q4"])
def test_captured_scores_are_the_attention_weights_over_latent_positions(folders, weights, monkeypatch):
    model, tok = mlx_lm.load(str(folders[weights]))
    loading.upcast_on_cpu(model)  # as the engine runs it
    ids = tok.encode(PROMPT)
    monkeypatch.setattr(capture, "BLOCK_ELEMENTS", 64)  # several query blocks per chunk
    # Chunks of 7 (multi-token path) and the held-back last token alone (mlx-lm's absorbed one-token path).
    result = capture.prefill_with_capture(model, ids, window=WINDOW, chunk_size=7, h2o="lazy", hold_last=True)
    assert not result.skipped and result.forward_calls == -(-(len(ids) - 1) // 7) + 1
    reference = _numpy_attention(model, ids)
    for observed in (result, result.before_last):
        T = observed.n_tokens
        for layer, (obs, (weights_np, keys)) in enumerate(zip(observed.observations, reference, strict=True)):
            P = weights_np[:, :T, :T]  # causal: the first T queries see only the first T keys
            assert obs.latent and (obs.n_q_heads, obs.n_kv_heads) == (P.shape[0], 1)
            np.testing.assert_allclose(np.array(obs.keys), keys[None, :T], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(
                np.array(window_attention(obs, WINDOW)), P[:, T - WINDOW :], rtol=1e-4, atol=1e-5
            )
            np.testing.assert_allclose(np.array(obs.ensure_h2o()), P.sum(axis=1), rtol=1e-4, atol=1e-4)
            # The methods' scores sum (average) over every query head: one row for the one latent head.
            h2o = methods.get("h2o").scores(obs, layer)
            want = (P.sum(axis=1) / np.arange(T, 0, -1)).mean(axis=0, keepdims=True)
            np.testing.assert_allclose(np.array(h2o), want, rtol=1e-4, atol=1e-5)
            tova = methods.get("tova").scores(obs, layer)
            np.testing.assert_allclose(
                np.array(tova), P[:, -1].mean(axis=0, keepdims=True), rtol=1e-4, atol=1e-5
            )
            # The heads disagree, so summing over them is what is checked.
            assert P[:, -1].std(axis=0).max() > 1e-3
    # No rope output reaches a latent layer's attention as its queries: no expected_attention statistics.
    assert all(o.query_stats is None and o.values is None for o in result.observations)
    with pytest.raises(ValueError, match="latent attention .MLA. layers: choose another method"):
        methods.get("expected_attention").scores(result.observations[0], 0)


@pytest.mark.parametrize("method", ["expected_attention", "adakv-expected_attention"])
def test_expected_attention_is_refused_on_a_latent_model_before_the_prefill(folders, capsys, method):
    session = Session.load(str(folders["bf16"]))
    with pytest.raises(ValueError, match=f"^{method} needs pre-RoPE query statistics.*choose another method"):
        session.check_config(CompressionConfig(method, 0.5))
    assert session.forward_calls == 0
    argv = ["compress", "--model", str(folders["bf16"]), "-p", PROMPT, "--method", method, "--tokens", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "multi-head latent attention" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("method", ["snapkv", "h2o", "adakv"])
def test_cli_compresses_the_latent_cache(folders, tmp_path, capsys, method):
    out, positions = tmp_path / "stats.csv", tmp_path / "kept.json"
    argv = ["compress", "--model", str(folders["bf16"]), "-p", PROMPT, "--method", method, "--ratio", "0.5"]
    assert main([*argv, "--tokens", "3", "--csv", str(out), "--positions", str(positions), "--json"]) == 0
    captured = capsys.readouterr()
    rows = list(csv.DictReader(out.open()))
    config = ARCHS["deepseek_v3"]
    # One row per layer: the one latent head.
    assert len(rows) == config["num_hidden_layers"] and {r["kv_head"] for r in rows} == {"0"}
    row_bytes = (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 4  # latent + RoPE key, float32
    for r in rows:
        assert int(r["tokens_kept"]) == int(r["tokens_total"]) // 2  # kvpress's int(T · 0.5)
        assert int(r["bytes_compressed"]) == int(r["tokens_kept"]) * row_bytes
        assert int(r["bytes_dense"]) == int(r["tokens_total"]) * row_bytes
    kept = json.loads(positions.read_text())
    assert json.dumps(kept) and len(kept) > 0
    assert ("per-head budgets are one shared selection" in captured.err) == (method == "adakv")


def test_session_file_keeps_the_latent_observations(folders, tmp_path):
    """A saved MLA prefill scores and selects exactly as the live one (the queries are r+p wide, one kv-head)."""
    live = Session.load(str(folders["bf16"]))
    live.prefill(PROMPT, n_tokens=3, chat_template=False)
    save_session(tmp_path / "mla.kvlens", live)
    opened = Session.load(str(folders["bf16"]))
    open_session(tmp_path / "mla.kvlens", opened)
    for method, schedule in (("h2o", "paper"), ("snapkv", "mlx-lm")):
        config = CompressionConfig(method, 0.5, schedule=schedule)
        want, got = live.compress(config), opened.compress(config)
        assert got.kept.shape[1] == 1 and (got.kept == want.kept).all() and not got.kept.all()
        assert opened.regenerate(got).tokens == live.regenerate(want).tokens
