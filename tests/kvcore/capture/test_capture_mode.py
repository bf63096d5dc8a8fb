"""h2o capture by backend (issue 15): "auto" picks lazy on this CPU, eager sums equal lazy ones and keep no queries."""

import logging

import mlx.core as mx
import numpy as np
import pytest

from kvcore.capture import h2o_mode as capture_mode
from kvcore.capture.prefill import _kept_query_bytes, prefill_with_capture
from kvcore.defaults import CAPTURE_WINDOW, H2O_CAPTURE_ENV, LAZY_QUERY_SHARE
from kvcore.engine.session import CompressionConfig, Session
from tests.kvcore.conftest import PROMPT


def test_auto_is_lazy_on_a_cpu_and_the_env_overrides_it(monkeypatch):
    monkeypatch.delenv(H2O_CAPTURE_ENV, raising=False)
    assert mx.default_device().type == mx.cpu
    mode, why = capture_mode.resolve("auto")
    assert mode == "lazy" and "CPU" in why
    for value in ("eager", "lazy"):
        monkeypatch.setenv(H2O_CAPTURE_ENV, value)
        assert capture_mode.resolve("auto") == (value, f"{H2O_CAPTURE_ENV}={value}")
        assert capture_mode.resolve("lazy" if value == "eager" else "eager")[0] != value  # explicit beats env
    monkeypatch.setenv(H2O_CAPTURE_ENV, "fast")
    with pytest.raises(ValueError, match=f"{H2O_CAPTURE_ENV}='fast': set it to eager or lazy"):
        capture_mode.resolve("auto")
    with pytest.raises(ValueError, match="must be one of auto, eager, lazy"):
        capture_mode.resolve("sometimes")


def test_auto_capture_logs_its_choice(loaded_models, monkeypatch, caplog):
    monkeypatch.delenv(H2O_CAPTURE_ENV, raising=False)
    model, tok = loaded_models["llama"]
    with caplog.at_level(logging.INFO, logger="kvcore"):
        result = prefill_with_capture(model, tok.encode(PROMPT), window=8, h2o="auto", hold_last=True)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("h2o capture:")]
    assert len(lines) == 1 and lines[0].startswith("h2o capture: lazy (default device Device(cpu")
    assert result.h2o_mode == result.before_last.h2o_mode == "lazy"


def _session(model_dirs, arch: str, mode: str, monkeypatch) -> Session:
    monkeypatch.setenv(H2O_CAPTURE_ENV, mode)
    s = Session.load(str(model_dirs[arch]))
    s.prefill(PROMPT * 4, n_tokens=2)
    return s


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_eager_session_keeps_no_queries_and_selects_like_lazy(model_dirs, monkeypatch, arch):
    eager, lazy = (_session(model_dirs, arch, m, monkeypatch) for m in ("eager", "lazy"))
    assert eager._capture.h2o_mode == "eager" and lazy._capture.h2o_mode == "lazy"
    for schedule in ("paper", "mlx-lm"):
        for obs_e, obs_l in zip(
            eager._observed(schedule).observations, lazy._observed(schedule).observations, strict=True
        ):
            # Eager holds the window and the sums only; lazy holds every prefill query until h2o is asked for.
            assert obs_e.pending_queries is None and obs_e.h2o_sums is not None
            assert obs_e.window_queries.shape[1] == min(CAPTURE_WINDOW, obs_e.n_tokens)
            assert obs_l.h2o_sums is None and sum(q.shape[1] for q in obs_l.pending_queries) == obs_l.n_tokens
            np.testing.assert_allclose(
                np.array(obs_e.h2o_sums), np.array(obs_l.ensure_h2o()), rtol=1e-5, atol=1e-6
            )
        for method in ("h2o", "adakv-h2o", "expected_attention"):  # its statistics are queued the same way
            for per_head in (True, False) if method == "h2o" else (True,):
                cfg = CompressionConfig(method, 0.3, per_head=per_head, schedule=schedule)
                a, b = eager.compress(cfg), lazy.compress(cfg)
                assert np.array_equal(a.kept, b.kept)
                assert a.kept.sum() < a.kept.size  # a real selection


def test_a_gpu_keeps_the_queries_while_they_fit_in_a_share_of_free_memory():
    """The GPU's rule (issue 15: eager sums cost 2.8-12x a plain prefill on the H200, kept queries none)."""
    gib = 2**30
    mode, why = capture_mode.on_gpu(int(8.6 * gib), 116 * gib)  # 8B at 32k on the H200
    assert mode == "lazy" and "8.60 GiB of 116.0 GiB free" in why
    mode, why = capture_mode.on_gpu(int(8.6 * gib), 19 * gib)  # the same on a 32 GB Mac
    assert mode == "eager" and f"more than {LAZY_QUERY_SHARE:.0%}" in why
    assert capture_mode.on_gpu(None, 116 * gib)[0] == "eager"
    share = int(LAZY_QUERY_SHARE * 100 * gib)
    assert capture_mode.on_gpu(share, 100 * gib)[0] == "lazy"
    assert capture_mode.on_gpu(share + 1, 100 * gib)[0] == "eager"
    assert capture_mode.on_gpu(1, -5)[0] == "eager"  # nothing free


def test_the_kept_query_estimate_is_what_lazy_keeps(loaded_models):
    model, tok = loaded_models["llama"]
    ids = tok.encode(PROMPT)
    kept = prefill_with_capture(model, ids, window=8, h2o="lazy").observations
    held = sum(q.shape[0] * q.shape[1] * q.shape[2] for o in kept if o for q in o.pending_queries)
    assert _kept_query_bytes(model, len(ids)) == held * 2
