"""Sweep: one prefill serves every configuration; each point equals a separate Session computing that config."""

import math

import pytest

from kvcore.engine.session import CompressionConfig, Session
from kvcore.engine.sweep import grid, parse_ratios, remaining_seconds, run_sweep

PROMPT = (
    "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog. " * 2
)
TOKENS = 5
TIMINGS = ("recompress_ms", "regenerate_ms")


def _loaded(model_dirs) -> Session:
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=TOKENS)
    return s


@pytest.fixture(scope="module")
def session(model_dirs):
    return _loaded(model_dirs)


def _configs():
    base = CompressionConfig(window=16, schedule="mlx-lm")
    return grid(["snapkv", "knorm", "streaming_llm"], [0.25, 0.5], [4, 16], group_size=32, base=base)


def test_grid_is_every_combination_with_the_base_fields():
    configs = _configs()
    assert len(configs) == 12
    assert [(c.method, c.ratio, c.bits) for c in configs[:4]] == [
        ("snapkv", 0.25, 4),
        ("snapkv", 0.25, None),
        ("snapkv", 0.5, 4),
        ("snapkv", 0.5, None),
    ]
    assert {(c.window, c.schedule, c.group_size) for c in configs} == {(16, "mlx-lm", 32)}
    with pytest.raises(ValueError, match="choose ratios"):
        grid(["snapkv"], [], [16])
    with pytest.raises(ValueError, match="unknown method"):
        grid(["nope"], [0.5], [16])


def test_ratios_parse_as_a_list_or_an_inclusive_range():
    assert parse_ratios("0.1, 0.25,0.5") == [0.1, 0.25, 0.5]
    assert parse_ratios("0.1:0.5:0.1") == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert parse_ratios("0.25:0.25:0.1") == [0.25]
    for text, message in [
        ("", "no retention ratios"),
        ("0.1:x:0.1", "start:stop:step"),
        ("0.5:0.1:0.1", "step must be positive"),
        ("0.1:1:0.0001", "at most"),
        ("0,0.5", "outside"),
        ("a,b", "comma-separated"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_ratios(text)


def test_every_point_equals_a_separate_session_on_the_same_config(session, model_dirs):
    configs = _configs()
    progress = []
    points = list(run_sweep(session, configs, on_progress=lambda d, t, p: progress.append((d, t, p.index))))
    assert [p.config for p in points] == configs
    assert progress == [(i + 1, 12, i) for i in range(12)]
    other = _loaded(model_dirs)  # its own load and prefill: nothing shared with `session`
    for point, cfg in zip(points, configs, strict=True):
        state = other.compress(cfg)
        regen = other.regenerate(state)
        expected = {k: v for k, v in regen.metrics.items() if k not in ("kl_per_step", *TIMINGS)}
        assert {k: v for k, v in point.metrics.items() if k not in TIMINGS} == expected, cfg
        assert (point.bytes_dense, point.bytes_compressed) == (state.bytes_dense, state.bytes_compressed)
        assert point.percent_of_dense == pytest.approx(100 * state.bytes_compressed / state.bytes_dense)
        assert point.stats_rows == state.stats_rows
        rows = point.csv_rows()
        assert len(rows) == len(state.stats_rows) and all(
            r["kl_mean"] == regen.metrics["kl_mean"] for r in rows
        )
        assert all(r["bytes_compressed_total"] == state.bytes_compressed for r in rows)


def test_cancel_keeps_the_finished_points_and_the_session_stays_usable(session):
    configs = _configs()
    points = []
    for p in run_sweep(session, configs, should_cancel=lambda: len(points) >= 3):
        points.append(p)
    assert [p.index for p in points] == [0, 1, 2]
    # cancelled inside the first point's regeneration: nothing is yielded
    calls = []
    assert list(run_sweep(session, configs, should_cancel=lambda: calls.append(1) or len(calls) > 1)) == []
    again = list(run_sweep(session, configs[3:4]))
    state = session.compress(configs[3])
    assert again[0].metrics["kl_mean"] == session.regenerate(state).metrics["kl_mean"]


def test_bad_group_size_is_refused_before_any_point(session):
    configs = grid(["snapkv"], [0.5], [16, 4], group_size=64)  # head_dim 32
    ran = []
    with pytest.raises(ValueError, match="does not divide head_dim 32"):
        list(run_sweep(session, configs, on_progress=lambda *a: ran.append(a)))
    assert ran == []


def test_remaining_time_is_the_mean_point_time_times_the_points_left(session):
    points = list(run_sweep(session, _configs()[:2]))
    assert remaining_seconds([], 12) is None
    mean = (points[0].seconds + points[1].seconds) / 2
    assert math.isclose(remaining_seconds(points, 12), mean * 10)


def test_a_sweep_over_questions_scores_each_point_as_session_answer_does(session):
    """With questions the prefill is their context: each point's question_accuracy is the share of
    Session.answer's compressed answers that contain the expected answer (query-agnostic)."""
    from kvcore.engine.questions import Question, accuracy

    first = session.answer(session.compress(CompressionConfig(ratio=1.0)), Question("x = "), 2)
    questions = [Question("x = ", first.dense_text), Question("def f(", "§never§"), Question("y")]
    configs = grid(["snapkv"], [0.25, 1.0], [16])
    points = list(run_sweep(session, configs, questions=questions, answer_tokens=2))
    for point in points:
        state = session.compress(point.config)
        want = accuracy([session.answer(state, q, 2) for q in questions], compressed=True)
        assert point.metrics["question_accuracy"] == want
    assert points[-1].metrics["question_accuracy"] == 0.5, "ratio 1 answers as dense: one of two right"
    plain = next(run_sweep(session, configs[:1]))
    assert "question_accuracy" not in plain.metrics
