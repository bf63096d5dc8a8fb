"""Sliding-window layers (mlx-lm's RotatingKVCache) measured in their steady state, listed as not compressible."""

import mlx.core as mx
import numpy as np
import pytest

from kvcore.cache import sparse as caches
from kvcore.engine.session import CompressionConfig, Session
from tests.model_factory import ARCHS, build_model

PROMPT = "def main(argv): return sum(x * x for x in argv) The quick brown fox jumps over the lazy dog. " * 2


@pytest.fixture(scope="module", params=["gemma3_text", "gpt_oss"])
def session(request, tmp_path_factory):
    folder = build_model(tmp_path_factory.mktemp("sliding") / request.param, request.param)
    s = Session.load(str(folder))
    s.prefill(PROMPT, n_tokens=2)
    return s


@pytest.mark.parametrize("schedule", ["paper", "mlx-lm"])
def test_bytes_equal_the_stored_arrays_after_the_next_token(session, schedule):
    """A one-pass prefill leaves T rows in a window layer; the next token (mlx-lm's own update) trims it to the
    window. The reported bytes are those of the trimmed arrays; the stats list the layer as not compressible."""
    window = ARCHS[session.info.model_type]["sliding_window"]
    state = session.compress(CompressionConfig(method="snapkv", ratio=0.5, schedule=schedule))
    observed = session._observed(schedule).cache
    sliding = [i for i, c in enumerate(observed) if caches.sliding_window(c) is not None]
    assert sliding and sorted(state.not_compressible) == sliding
    T = state.kept.shape[2]
    # "mlx-lm" compresses the one-pass prefill state (T rows); "paper" the state after the held last token,
    # which mlx-lm's single-token update already trimmed to the window.
    held = T if schedule == "mlx-lm" else window
    assert window < T and all(observed[i].keys.shape[2] == held for i in sliding)

    stepped = caches.copy_cache(state.cache)
    mx.eval(session.model(mx.array([[session.dense_tokens[0]]]), cache=stepped))
    rows = {r["layer"]: [] for r in state.stats_rows}
    for r in state.stats_rows:
        rows[r["layer"]].append(r)
    for i in sliding:
        stored = stepped[i].keys.nbytes + stepped[i].values.nbytes
        assert stepped[i].keys.shape[2] == window
        assert sum(r["bytes_dense"] for r in rows[i]) == stored == sum(r["bytes_compressed"] for r in rows[i])
        assert all(not r["compressible"] and r["tokens_kept"] == window for r in rows[i])
        assert state.not_compressible[i] == f"sliding window {window}: not compressible"
        np.testing.assert_array_equal(state.kept[i].sum(axis=1), window)
        assert state.kept[i][:, -window:].all()
    assert all(r["compressible"] for i, layer in rows.items() if i not in sliding for r in layer)

    fixed = sum(r["bytes_dense"] for i in sliding for r in rows[i])
    dense = sum(r["bytes_dense"] for r in state.stats_rows)
    compressed = sum(r["bytes_compressed"] for r in state.stats_rows)
    assert state.bytes_not_compressible == fixed
    assert (state.bytes_dense, state.bytes_compressed) == (dense, compressed)
    assert state.compressible_ratio == pytest.approx((compressed - fixed) / (dense - fixed))
    assert state.compressible_ratio < state.bytes_compressed / state.bytes_dense < 1
