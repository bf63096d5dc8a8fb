"""The engine thread: one thread for every job, coalescing, stale results dropped, errors and cancel."""

import threading
import time

import pytest

from app.engine.thread import EngineThread


@pytest.fixture
def engine(qtbot):
    eng = EngineThread()
    results, failures = [], []
    eng.resultReady.connect(results.append)
    eng.failed.connect(failures.append)
    eng.start()
    eng.results, eng.failures = results, failures
    yield eng
    eng.shutdown()


def test_every_job_runs_on_the_one_engine_thread(engine, qtbot):
    import mlx.core as mx

    def job(ctx):
        return threading.get_ident(), float(mx.sum(mx.ones((4, 4))).item())

    ids = [engine.submit(f"k{i}", job) for i in range(5)]
    qtbot.waitUntil(lambda: len(engine.results) == 5, timeout=5000)
    threads = {r.value[0] for r in engine.results}
    assert threads == {engine.thread_ident}
    assert engine.thread_ident != threading.get_ident()
    assert [r.request_id for r in engine.results] == ids
    assert all(r.value[1] == 16.0 for r in engine.results)


def test_burst_is_coalesced_and_only_the_last_result_shown(engine, qtbot):
    gate = threading.Event()
    seen_ids = []

    def slow(ctx):
        gate.wait(5)
        return "first"

    def make(i):
        def job(ctx):
            seen_ids.append(ctx.request_id)
            return i

        return job

    engine.submit("compress", slow, coalesce=True)
    time.sleep(0.05)
    last = [engine.submit("compress", make(i), coalesce=True) for i in range(200)][-1]
    gate.set()
    qtbot.waitUntil(lambda: any(r.request_id == last for r in engine.results), timeout=5000)
    qtbot.wait(50)
    assert [r.value for r in engine.results] == [199]
    assert seen_ids == [last]


def test_error_becomes_a_message_and_thread_survives(engine, qtbot):
    def bad(ctx):
        raise ValueError("prompt is empty: type a prompt first")

    engine.submit("prefill", bad)
    engine.submit("ok", lambda ctx: 1)
    qtbot.waitUntil(lambda: bool(engine.results), timeout=5000)
    assert engine.failures[0].message == "prompt is empty: type a prompt first"
    assert engine.results[0].value == 1


def test_cancel_stops_running_job(engine, qtbot):
    started = threading.Event()

    def long(ctx):
        started.set()
        for _ in range(500):
            ctx.check_cancelled()
            time.sleep(0.01)
        return "finished"

    engine.submit("generate", long)
    assert started.wait(5)
    engine.cancel()
    qtbot.waitUntil(lambda: bool(engine.failures), timeout=5000)
    assert engine.failures[0].cancelled
    assert engine.results == []


def test_each_job_gets_its_own_callbacks_on_the_gui_thread(engine, qtbot):
    calls = []

    def record(name):
        return lambda value: calls.append((name, value.request_id, threading.get_ident()))

    def publishing(ctx):
        ctx.publish("half")
        return "done"

    def bad(ctx):
        raise ValueError("no")

    ok = engine.submit("a", publishing, on_result=record("result"), on_partial=record("partial"))
    failed = engine.submit("b", bad, on_result=record("never"), on_failure=record("failure"))
    plain = engine.submit("c", lambda ctx: 3)
    qtbot.waitUntil(lambda: any(r.request_id == plain for r in engine.results), timeout=5000)
    gui = threading.get_ident()
    assert calls == [("partial", ok, gui), ("result", ok, gui), ("failure", failed, gui)]
    assert engine._callbacks == {}


def test_superseded_and_dropped_jobs_call_nothing_and_leave_no_callbacks(engine, qtbot):
    gate, started = threading.Event(), threading.Event()
    calls = []

    def slow(ctx):
        started.set()
        gate.wait(5)
        return "stale"

    engine.submit("compress", slow, coalesce=True, on_result=calls.append, on_failure=calls.append)
    assert started.wait(5)
    for i in range(5):
        engine.submit("compress", lambda ctx, i=i: i, coalesce=True, on_result=calls.append)
    last = engine.submit("compress", lambda ctx: "last", coalesce=True, on_result=calls.append)
    gate.set()
    qtbot.waitUntil(lambda: any(r.request_id == last for r in engine.results), timeout=5000)
    qtbot.wait(50)
    assert [r.value for r in calls] == ["last"]
    assert engine._callbacks == {}
