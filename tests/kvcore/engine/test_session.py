"""Session: prefill once, compress many times without a forward pass, regenerate against the dense baseline."""

import threading

import numpy as np
import pytest

from kvcore.cache import sparse as caches
from kvcore.capture.prefill import Cancelled
from kvcore.defaults import SCHEDULES
from kvcore.engine.session import CompressionConfig, Session
from tests.reference_logits import compressed_logits, dense_logits

PROMPT = (
    "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog. " * 3
)


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=12)
    return s


def test_full_is_lossless(session):
    state = session.compress(CompressionConfig("full", 1.0))
    regen = session.regenerate(state)
    assert regen.tokens == session.dense_tokens
    assert regen.metrics["kl_mean"] == 0.0 and regen.metrics["kl_max"] == 0.0
    assert regen.metrics["agreement"] == 1.0
    assert regen.metrics["first_divergence"] is None
    assert state.bytes_compressed == state.bytes_dense


def test_lower_ratio_fewer_bytes_exactly_counted(session):
    info, T = session.info, session.n_compressible("paper")
    sizes = []
    for ratio in (1.0, 0.5, 0.25, 0.1):
        state = session.compress(CompressionConfig("snapkv", ratio))
        n = max(1, int(T * (1 - (1 - ratio))))  # kvpress's int(T·(1 − c)), c = 1 − r (DESIGN.md)
        assert (state.kept.sum(axis=2) == n).all()
        expected = 2 * info.n_layers * info.n_kv_heads * n * info.head_dim * 4  # float32 test weights
        assert state.bytes_compressed == expected == caches.cache_tensor_bytes(state.cache)
        assert sum(r["bytes_compressed"] for r in state.stats_rows) == state.bytes_compressed
        sizes.append(state.bytes_compressed)
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 4


def test_recompress_never_runs_the_model(session):
    before = session.forward_calls
    for method in ("snapkv", "h2o", "tova", "knorm", "streaming_llm", "pyramidkv", "adakv", "random"):
        for bits in (None, 4):
            session.compress(CompressionConfig(method, 0.3, bits=bits, group_size=32))
    assert session.forward_calls == before


def test_quantized_stats_report_error(session):
    state = session.compress(CompressionConfig("h2o", 0.5, bits=4, group_size=32))
    rows = state.stats_rows
    assert len(rows) == session.info.n_layers * session.info.n_kv_heads
    assert all(r["key_rmse"] > 0 and r["value_rmse"] > 0 and r["key_bits"] == 4 for r in rows)
    kept_err = state.quant_error[state.kept]
    assert np.isfinite(kept_err).all() and (kept_err > 0).all()
    assert np.isnan(state.quant_error[~state.kept]).all()
    state8 = session.compress(CompressionConfig("h2o", 0.5, bits=8, group_size=32))
    assert np.nanmean(state8.quant_error) < np.nanmean(state.quant_error)


def test_stats_rows_match_kept_mask_and_attention_mass(session):
    state = session.compress(CompressionConfig("adakv", 0.25))
    counts = state.kept.sum(axis=2)
    assert len(set(counts[0].tolist())) > 1 or len(set(counts[1].tolist())) > 1  # ragged somewhere
    for r in state.stats_rows:
        assert r["tokens_kept"] == counts[r["layer"], r["kv_head"]]
        assert 0.0 <= r["attention_mass_kept"] <= 1.0 + 1e-5
    full = session.compress(CompressionConfig("full", 1.0))
    assert all(r["attention_mass_kept"] == pytest.approx(1.0, abs=1e-4) for r in full.stats_rows)


def test_attention_mass_is_measured_over_the_configured_window(session):
    """knorm ignores the window, so both configs keep the same positions; only the measuring window differs."""
    narrow = session.compress(CompressionConfig("knorm", 0.25, window=4))
    wide = session.compress(CompressionConfig("knorm", 0.25, window=64))
    assert (narrow.kept == wide.kept).all()
    mass = [np.array([r["attention_mass_kept"] for r in s.stats_rows]) for s in (narrow, wide)]
    assert np.abs(mass[0] - mass[1]).max() > 1e-3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(method="nope"), "unknown method"),
        (dict(ratio=0.0), "ratio must be in"),
        (dict(ratio=1.5), "ratio must be in"),
        (dict(bits=7), "bits must be one of"),
        (dict(group_size=48), "group size must be one of"),
    ],
)
def test_bad_config_is_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig(**kwargs)


def test_group_size_must_divide_head_dim(session):
    with pytest.raises(ValueError, match="does not divide head_dim 32"):
        session.compress(CompressionConfig("snapkv", 0.5, bits=4, group_size=64))


def test_bad_prompts_keep_the_previous_session(session):
    tokens, ids = list(session.dense_tokens), list(session.prompt_ids)
    config = CompressionConfig("snapkv", 0.5)
    before = session.regenerate(session.compress(config))
    with pytest.raises(ValueError, match="too short"):
        session.prefill("")
    with pytest.raises(ValueError, match="context is 4096"):
        session.prefill(list(range(5)) * 1000)
    with pytest.raises(Cancelled):
        session.prefill(PROMPT, should_cancel=lambda: True)
    assert session.dense_tokens == tokens and session.prompt_ids == ids
    after = session.regenerate(session.compress(config))
    assert after.tokens == before.tokens
    assert after.metrics["kl_mean"] == before.metrics["kl_mean"] and after.metrics["kl_per_step"]


def test_session_refuses_other_threads(session):
    errors = []

    def worker():
        try:
            session.compress(CompressionConfig("snapkv", 0.5))
        except RuntimeError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert errors and "engine thread" in errors[0]


def test_extend_grows_the_baseline(model_dirs):
    s = Session.load(str(model_dirs["qwen3"]))
    s.prefill(PROMPT, n_tokens=4)
    first = list(s.dense_tokens)
    s.extend(3)
    assert s.dense_tokens[:4] == first and len(s.dense_tokens) == 7
    regen = s.regenerate(s.compress(CompressionConfig("full", 1.0)))
    assert regen.tokens == s.dense_tokens


def test_prefill_defers_h2o_until_asked(model_dirs, monkeypatch):
    """Session.prefill keeps queries, not h2o sums; the first h2o compress computes them without a forward pass
    (and frees queries above KEEP_PROMPT_QUERIES_BYTES: 0 here)."""
    from kvcore import defaults

    monkeypatch.setattr(defaults, "KEEP_PROMPT_QUERIES_BYTES", 0)
    s = Session.load(str(model_dirs["qwen3"]))
    s.prefill(PROMPT, n_tokens=4)
    observations = s._capture.observations
    assert all(o.h2o_sums is None and o.pending_queries for o in observations)
    calls = s.forward_calls
    s.compress(CompressionConfig("snapkv", 0.5))
    assert all(o.h2o_sums is None for o in observations)
    s.compress(CompressionConfig("h2o", 0.5))
    assert all(o.h2o_sums is not None and o.pending_queries is None for o in observations)
    assert s.forward_calls == calls


def test_methods_reading_every_query_still_run_after_h2o_on_a_short_prompt(model_dirs):
    """Under KEEP_PROMPT_QUERIES_BYTES the prompt's queries outlive h2o's sums: compactor after h2o equals
    compactor on a fresh prefill."""
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=2)
    s.compress(CompressionConfig("h2o", 0.5))
    after = s.kept_positions(s.compress(CompressionConfig("non_causal_attention", 0.5)))
    fresh = Session.load(str(model_dirs["llama"]))
    fresh.prefill(PROMPT, n_tokens=2)
    assert after == fresh.kept_positions(fresh.compress(CompressionConfig("non_causal_attention", 0.5)))


def test_quantized_compress_equals_select_then_quantize(session):
    """compress gathers rows of a once-packed dense cache: bit-identical to packing the gathered rows."""
    import mlx.core as mx

    for bits, ratio in ((4, 0.5), (4, 0.25), (8, 0.25)):
        cfg = CompressionConfig("knorm", ratio, bits=bits, group_size=32)
        state = session.compress(cfg)
        dense = session._capture.cache
        ref = caches.quantize_cache(caches.select_positions(dense, state.selection), bits=bits, group_size=32)
        for got, want in zip(state.cache, ref, strict=True):
            assert got.offset == want.offset and got.bits == bits
            for a, b in zip(got.keys_and_values(), want.keys_and_values(), strict=True):
                for x, y in zip(a, b, strict=True):
                    assert mx.array_equal(x, y).item()
            for p, q in zip(got.retained_positions, want.retained_positions, strict=True):
                np.testing.assert_array_equal(p, q)


def _snapshot(s: Session, config: CompressionConfig) -> tuple:
    """What a cancelled prefill or extend must leave untouched: ids, continuation, references, decode cache."""
    return (
        list(s.prompt_ids),
        list(s.dense_tokens),
        {k: s.dense_reference(k).copy() for k in SCHEDULES},  # computed from the continuation if not yet
        s._dense_decode_cache[0].offset,
        s.regenerate(s.compress(config)).metrics,
    )


def _assert_same(after: tuple, before: tuple, where: str) -> None:
    assert after[:2] == before[:2], f"{where} changed the prompt or the continuation"
    assert after[2].keys() == before[2].keys(), where
    for schedule, logits in before[2].items():
        np.testing.assert_array_equal(after[2][schedule], logits, err_msg=where)
    assert after[3] == before[3], f"{where} changed the dense decode cache"
    metrics = after[4]
    assert all(np.isfinite(metrics[k]) for k in ("kl_mean", "agreement")), f"{where}: metrics are NaN"
    assert metrics["kl_mean"] == before[4]["kl_mean"] and metrics["agreement"] == before[4]["agreement"]


def _cancel_on(k: int):
    """A should_cancel that says no k - 1 times, then yes."""
    seen: list[int] = []
    return lambda: len(seen) == k - 1 or bool(seen.append(1))


def test_cancel_at_every_stage_of_prefill_keeps_the_previous_session(model_dirs):
    """Cancel on the k-th check: prefill chunks, then each dense-continuation token (the reference passes wait
    until a schedule asks: `dense_reference`). The previous prompt, continuation, references and metrics stay."""
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=5)
    config = CompressionConfig("snapkv", 0.5)
    before = _snapshot(s, config)
    checks = []
    s.prefill("x = 1\n" * 40, n_tokens=5, should_cancel=lambda: checks.append(1) and False)
    s.prefill(PROMPT, n_tokens=5)
    # 2 prefill spans (body, held-back last token) + 4 greedy tokens
    assert len(checks) == 2 + 4
    for k in range(1, len(checks) + 1):
        with pytest.raises(Cancelled):
            s.prefill("x = 1\n" * 40, n_tokens=5, should_cancel=_cancel_on(k))
        _assert_same(_snapshot(s, config), before, f"cancel at check {k}")


def test_cancel_at_every_stage_of_extend_keeps_the_continuation(model_dirs):
    """Step/Generate cancelled at any token leaves the continuation it extended (and its references)."""
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=4)
    config = CompressionConfig("snapkv", 0.5)
    before = _snapshot(s, config)
    for k in range(1, 3 + 1):  # 3 greedy tokens
        with pytest.raises(Cancelled):
            s.extend(3, should_cancel=_cancel_on(k))
        _assert_same(_snapshot(s, config), before, f"extend cancelled at check {k}")
    s.extend(3, should_cancel=_cancel_on(4))  # the 4th check never comes: it completes
    assert len(s.dense_tokens) == 7 and s.dense_tokens[:4] == before[1]


def _softmax(logits: np.ndarray) -> np.ndarray:
    x = np.exp(logits.astype(np.float64) - logits.max())
    return x / x.sum()


@pytest.mark.parametrize("schedule", ["paper", "mlx-lm"])
def test_regenerate_per_step_metrics_equal_the_definition(session, schedule):
    state = session.compress(
        CompressionConfig("streaming_llm", 0.2, bits=2, group_size=32, schedule=schedule)
    )
    regen = session.regenerate(state)
    steps, tokens = regen.steps, session.dense_tokens
    dense = dense_logits(session.model, session.prompt_ids, tokens)
    comp = compressed_logits(session.model, state.cache, session.prompt_ids, tokens, schedule, dense)
    for i, token in enumerate(tokens):
        p, q = _softmax(dense[i]), _softmax(comp[i])
        assert steps.kl[i] == pytest.approx(float((p * np.log(p / q)).sum()), rel=1e-4, abs=1e-5)
        assert bool(steps.agreement[i]) == (int(comp[i].argmax()) == token)
        for ids, probs, ref in (
            (steps.dense_top_ids, steps.dense_top_probs, p),
            (steps.compressed_top_ids, steps.compressed_top_probs, q),
        ):
            order = np.argsort(-ref, kind="stable")[:5]
            np.testing.assert_allclose(probs[i], ref[order], rtol=1e-4, atol=1e-6)
            assert ids[i].tolist() == order.tolist()
    skip = regen.metrics["first_compressed_step"]
    assert regen.metrics["kl_per_step"] == steps.kl.tolist()
    assert regen.metrics["agreement"] == pytest.approx(steps.agreement[skip:].mean())
    assert steps.kl[skip:].max() > 0, "2-bit streaming_llm at 20 % should change some distribution"


def test_gpu_selection_path_compresses_to_the_same_caches(session, monkeypatch):
    """Session on a GPU builds kept rows on the device (issue 15); forced here on the CPU, every config gives the
    same stored bytes, kept mask and metrics as the host path."""
    import mlx.core as mx

    from kvcore.engine import session as session_module

    configs = [
        CompressionConfig("snapkv", 0.3),
        CompressionConfig("snapkv", 0.3, per_head=False),
        CompressionConfig("adakv-snapkv", 0.4),
        CompressionConfig("streaming_llm", 0.5, schedule="mlx-lm"),
        CompressionConfig("knorm", 0.25, bits=4, group_size=32),
    ]
    host = [session.compress(c) for c in configs]
    monkeypatch.setattr(session_module, "selects_on_device", lambda: True)
    calls = []
    real = session_module.device_select
    monkeypatch.setattr(session_module, "device_select", lambda *a: calls.append(1) or real(*a))
    for config, want in zip(configs, host, strict=True):
        got = session.compress(config)
        assert np.array_equal(got.kept, want.kept) and got.bytes_compressed == want.bytes_compressed
        for a, b in zip(got.cache, want.cache, strict=True):
            for x, y in zip(caches._arrays(a), caches._arrays(b), strict=True):
                assert np.array_equal(np.asarray(x.view(mx.uint8)), np.asarray(y.view(mx.uint8)))
        assert session.regenerate(got, 2).tokens == session.regenerate(want, 2).tokens
    assert len(calls) == len(configs)
