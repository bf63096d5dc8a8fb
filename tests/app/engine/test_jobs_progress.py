"""The prefill progress line: tokens done, the rate so far and the time the rest takes at that rate."""

from app.engine.jobs import prefill_progress_text


def test_rate_and_time_left():
    assert prefill_progress_text(2048, 32768, 2.0) == "Prefill 2,048/32,768 tokens · 1,024 tok/s · 30 s left"
    assert prefill_progress_text(300, 300, 0.5) == "Prefill 300/300 tokens · 600 tok/s"
    assert prefill_progress_text(0, 300, 0.0) == "Prefill 0/300 tokens"
