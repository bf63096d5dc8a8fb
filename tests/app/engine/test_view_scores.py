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
