"""The cache timeline of a decoding run, and the per-token comparison with the dense cache in lockstep."""

import csv

import numpy as np
import pytest

from kvcore.engine import timeline as timeline_module
from kvcore.engine.decode_metrics import decode_against_dense
from kvcore.engine.decoding import Compression, DecodeStep, DecodingPolicy, DecodingRun, decode_with_policy
from kvcore.engine.session import CompressionConfig, Session
from kvcore.engine.timeline import NEVER, TIMELINE_COLUMNS, timeline, write_timeline_csv

PROMPT = "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog. "
N = 24


def _hand_run() -> DecodingRun:
    """Six start positions, four steps, evictions at steps 2 and 4; layer 1 is stored whole."""
    policy = DecodingPolicy("streaming_llm", budget=4, interval=2, n_sink=1)
    steps = [DecodeStep(k, [0, 0], 0, k % 2 == 0) for k in range(1, 5)]
    compressions = [
        Compression(2, [[[0, 5, 6, 7], [0, 4, 7]], None], [4, 8], 0),
        Compression(4, [[[0, 7, 8, 9], [0, 9]], None], [4, 10], 0),
    ]
    return DecodingRun(policy, [11, 12, 13, 14], steps, compressions)


START = [[[0, 1, 2, 3, 4, 5], [0, 2, 4]], None]


def test_hand_made_run_evicted_at_held_and_share():
    tl = timeline(_hand_run(), 6, START)
    assert tl.n_positions == 10 and tl.n_steps == 4 and tl.whole_layers == (1,)
    assert tl.written_at.tolist() == [0, 0, 0, 0, 0, 0, 1, 2, 3, 4]
    N_ = NEVER
    assert tl.evicted_at[0, 0].tolist() == [N_, 2, 2, 2, 2, 4, 4, N_, N_, N_]
    assert tl.evicted_at[0, 1].tolist() == [N_, 0, 2, 0, 4, 0, 2, 4, 4, N_]
    assert (tl.evicted_at[1] == NEVER).all()
    assert tl.start_held[0, 1].tolist() == [True, False, True, False, True, False]
    assert np.flatnonzero(tl.held(2)[0, 1]).tolist() == [0, 4, 7]
    assert np.flatnonzero(tl.held(3)[0, 1]).tolist() == [0, 4, 7, 8]  # step 3 appended position 8
    assert np.flatnonzero(tl.held(1)[0, 0]).tolist() == [0, 1, 2, 3, 4, 5, 6]
    history = tl.head_history(0, 0)
    assert history.shape == (5, 10)
    for k in range(5):
        assert (history[k] == tl.held(k)[0, 0]).all()
    share = tl.share_held()  # over layer 0's two heads only (layer 1 is stored whole)
    expected = np.stack([tl.held(k)[0].mean(axis=0) for k in range(5)])
    np.testing.assert_allclose(share, expected)
    for k in range(5):
        np.testing.assert_allclose(tl.share_at(k), expected[k])
    np.testing.assert_allclose(tl.share_held(np.array([4, 1])), expected[[4, 1]])
    np.testing.assert_array_equal(tl.head_history(0, 1, np.array([3]))[0], tl.held(3)[0, 1])
    with pytest.raises(ValueError, match="outside the run"):
        tl.held(5)


def test_rows_replay_every_step_and_csv(tmp_path):
    tl = timeline(_hand_run(), 6, START)
    rows = tl.rows()
    assert rows == sorted(rows)
    assert (0, 0, 1, 1, 0) in rows and (0, 0, 1, 0, 1) in rows and (2, 0, 1, 2, 0) in rows
    state = {}
    for k in range(tl.n_steps + 1):
        for step, layer, head, pos, kept in rows:
            if step == k:
                state[layer, head, pos] = kept
        held = tl.held(k)
        for (layer, head, pos), kept in state.items():
            assert held[layer, head, pos] == bool(kept)
        assert sum(state.values()) == held.sum()
    path = tmp_path / "timeline.csv"
    assert write_timeline_csv(path, tl) == len(rows)
    with open(path, newline="") as f:
        read = list(csv.reader(f))
    assert tuple(read[0]) == TIMELINE_COLUMNS
    assert [tuple(int(v) for v in r) for r in read[1:]] == rows


@pytest.mark.parametrize(
    "start, message",
    [
        (
            [[[0, 1, 2, 3, 4, 5], [0, 2]], None],
            "which had left the cache",
        ),  # kept 4 after the prefill dropped it
        ([[[0, 1, 2, 3, 4, 5]], None], "kv-heads"),
        ([[[0, 9], [0]], None], "only 6 were written"),
    ],
)
def test_a_run_that_does_not_fit_its_start_is_one_line(start, message):
    with pytest.raises(ValueError, match=message):
        timeline(_hand_run(), 6, start)


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=N)
    return s


def _start(session, state):
    return [
        None if layer in state.not_compressible else per_head
        for layer, per_head in enumerate(session.kept_positions(state))
    ]


@pytest.mark.parametrize("schedule", ["paper", "mlx-lm"])
def test_real_decode_timeline_equals_every_compression(session, schedule, monkeypatch):
    state = session.compress(CompressionConfig("snapkv", 0.5, schedule=schedule))
    policy = DecodingPolicy("knorm", budget=10, interval=4)
    run = decode_with_policy(session, state, policy, N)
    T = session.n_compressible(schedule)
    tl = timeline(run, T, _start(session, state))
    assert tl.n_positions == T + len(run.steps) == len(session.prompt_ids) + len(run.tokens) - 1
    assert (tl.start_held == state.kept).all()
    for c in run.compressions:
        held = tl.held(c.step)
        for layer, per_head in enumerate(c.kept):
            for h, kept in enumerate(per_head):
                assert np.flatnonzero(held[layer, h]).tolist() == kept.tolist()
    share = tl.share_held()
    monkeypatch.setattr(timeline_module, "_BLOCK_CELLS", 3 * (tl.n_steps + 2))  # three columns a block
    np.testing.assert_allclose(tl.share_held(), share)
    np.testing.assert_allclose(share, np.stack([tl.share_at(k) for k in range(tl.n_steps + 1)]), atol=1e-6)
    last = run.compressions[-1]
    for k in range(last.step + 1, tl.n_steps + 1):  # after the last eviction the new positions just stay
        assert np.flatnonzero(tl.held(k)[0, 0]).tolist() == [*last.kept[0][0], *range(T + last.step, T + k)]


@pytest.mark.parametrize("schedule", ["paper", "mlx-lm"])
def test_lockstep_dense_comparison(session, schedule):
    state = session.compress(CompressionConfig("full", 1.0, schedule=schedule))
    roomy = decode_against_dense(session, state, DecodingPolicy("streaming_llm", budget=500, interval=4), N)
    assert roomy.run.tokens == session.dense_tokens[:N]
    assert roomy.first_divergence is None and roomy.steps.kl.shape == (N,)
    assert np.abs(roomy.steps.kl).max() < 1e-4 and roomy.steps.agreement.all()
    assert roomy.first_compared == (1 if schedule == "paper" else 0)
    tight = decode_against_dense(session, state, DecodingPolicy("streaming_llm", budget=6, interval=2), N)
    assert tight.run.tokens == decode_with_policy(session, state, tight.run.policy, N).tokens
    assert tight.steps.kl.shape == (N,) and tight.steps.kl.max() > 1e-3
    fd = tight.first_divergence
    if fd is not None:  # before it the history is the dense continuation's
        assert tight.run.tokens[:fd] == session.dense_tokens[:fd]
        assert tight.run.tokens[fd] != session.dense_tokens[fd]
    first = tight.first_compared
    assert (tight.steps.compressed_top_ids[first:, 0] == np.array(tight.run.tokens[first:])).all()


def test_lockstep_cancel_keeps_what_was_generated(session):
    state = session.compress(CompressionConfig("full", 1.0, schedule="mlx-lm"))
    calls = []

    def cancel_after_ten():
        calls.append(1)
        return len(calls) >= 10

    out = decode_against_dense(
        session, state, DecodingPolicy("knorm", budget=8, interval=3), N, should_cancel=cancel_after_ten
    )
    assert out.cancelled and 0 < len(out.run.tokens) < N
    assert len(out.steps.kl) == len(out.run.tokens) == len(out.run.steps)
