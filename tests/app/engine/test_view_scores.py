"""The Score view of a wrapper that picks its own positions shows what it ranked by, not its inner scores."""

from __future__ import annotations

import numpy as np

from app.engine.view_model import compression_view
from kvcore.engine.session import CompressionConfig, Session
from kvcore.methods import selection


def test_score_view_shows_chunkkvs_chunk_means(model_dirs):
    session = Session.load(str(model_dirs["llama"]))
    session.prefill(list(range(3, 63)), 1, chat_template=False)
    state = session.compress(CompressionConfig("chunkkv-knorm", 0.25, params={"chunk_length": 6}))
    view = compression_view(session, state, None)
    n = state.kept.shape[2]
    want = np.stack(selection.final_scores(state.ranking, 0.25)).reshape(-1, n)
    np.testing.assert_array_equal(view.scores[:, :n], want)
    inner = state.ranking.layers[0].scores
    assert not np.allclose(view.scores[: inner.shape[0], :n], inner)  # not knorm's own scores
    assert np.all(view.scores[:, :6] == view.scores[:, :1])  # one value per chunk


def test_score_view_of_critical_adakv_ranks_what_each_head_kept(model_dirs):
    """critical_adakv's Score view is its final ranking: each head's top (its kept count) are the kept positions."""
    session = Session.load(str(model_dirs["llama"]))
    session.prefill(list(range(3, 63)), 1, chat_template=False)
    state = session.compress(CompressionConfig("critical_adakv-knorm", 0.25))
    view = compression_view(session, state, None)
    n = state.kept.shape[2]
    shown = view.scores[:, :n].reshape(state.kept.shape)
    np.testing.assert_array_equal(shown, np.stack(selection.final_scores(state.ranking, 0.25)))
    for layer, kept in zip(shown, state.kept, strict=True):
        for row, mask in zip(layer, kept, strict=True):
            top = np.argsort(-row, kind="stable")[: mask.sum()]
            assert np.array_equal(np.sort(top), np.flatnonzero(mask))
    assert len({int(m.sum()) for m in state.kept.reshape(-1, n)}) > 1  # adakv's budgets differ between heads
