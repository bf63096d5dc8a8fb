"""How late the GUI event loop runs while the engine recompresses on every slider move (the demo model).

A QTimer probe fires every 5 ms and records how late each tick is; meanwhile the retention slider moves every
30 ms, as a drag does, so the engine thread recompresses (and regenerates) back to back. Prints the median,
p95, p99 and worst lateness for three phases (idle, dragging with auto-regenerate off, and on), how many
results were drawn during the drag, and the settle time from the last move to its result on screen.
Run: QT_QPA_PLATFORM=offscreen .venv/bin/python -m benchmarks.event_loop_latency [seconds per phase]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

PROBE_MS = 5
MOVE_MS = 30
TOKENS = 16


def _wait(app, condition, timeout: float) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError("the window did not finish in time")
        app.processEvents()
        time.sleep(0.005)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lateness_until(done, timeout: float) -> list[float]:  # noqa: ANN001
    """Run the real event loop with the PROBE_MS timer until `done()` is true (checked every probe) or `timeout`
    seconds pass; returns how late each tick fired, in ms. Shared with benchmarks.sweep_latency."""
    from PySide6.QtCore import QEventLoop, QTimer

    late: list[float] = []
    last = [time.perf_counter()]
    end = time.monotonic() + timeout
    loop = QEventLoop()

    def probe() -> None:
        now = time.perf_counter()
        late.append(max(0.0, (now - last[0]) * 1e3 - PROBE_MS))
        last[0] = now
        if done() or time.monotonic() > end:
            loop.quit()

    timer = QTimer()
    timer.setInterval(PROBE_MS)
    timer.timeout.connect(probe)
    timer.start()
    loop.exec()
    timer.stop()
    return late


def _phase(app, window, seconds: float, drag: bool) -> dict[str, float]:  # noqa: ANN001
    from PySide6.QtCore import QEventLoop, QTimer

    late: list[float] = []
    last = [time.perf_counter()]
    shown_before = len(window.displayed_ids)
    moves = [0]

    def probe() -> None:
        now = time.perf_counter()
        late.append(max(0.0, (now - last[0]) * 1e3 - PROBE_MS))
        last[0] = now

    def move() -> None:
        moves[0] += 1
        window.controls.retentionSlider.setValue(5 + (moves[0] * 7) % 90)

    probe_timer, move_timer = QTimer(), QTimer()
    probe_timer.setInterval(PROBE_MS)
    probe_timer.timeout.connect(probe)
    move_timer.setInterval(MOVE_MS)
    move_timer.timeout.connect(move)
    probe_timer.start()
    if drag:
        move_timer.start()
    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()  # the real event loop, as the app runs it
    move_timer.stop()
    last_request = window.engine.latest_id("compress")
    stopped = time.perf_counter()
    settle = 0.0
    if drag:
        _wait(app, lambda: window.displayed_ids and window.displayed_ids[-1] == last_request, 120)
        settle = (time.perf_counter() - stopped) * 1e3
    probe_timer.stop()
    return {
        "ticks": len(late),
        "median": statistics.median(late),
        "p95": percentile(late, 0.95),
        "p99": percentile(late, 0.99),
        "worst": max(late),
        "moves": moves[0],
        "shown": len(window.displayed_ids) - shown_before,
        "settle": settle,
    }


def main(seconds: float = 8.0) -> None:
    from PySide6.QtWidgets import QApplication

    from app.window.main_window import MainWindow, default_model
    from kvcore.resources import prompts_dir

    if default_model() is None:
        sys.exit("The demo model is missing (resources/models/kvlens-demo).")
    app = QApplication.instance() or QApplication([])
    prompt_file = prompts_dir() / "long_identifier.txt"
    prompt = (
        prompt_file.read_text(encoding="utf-8") if prompt_file.is_file() else "def f(x):\n    return x\n" * 40
    )
    with tempfile.TemporaryDirectory() as tmp:
        window = MainWindow(settings_path=Path(tmp) / "settings.json", continuation_tokens=TOKENS)
        window.show()
        _wait(app, lambda: window.model_info is not None, 120)
        window.prefill(prompt)
        _wait(app, lambda: window.displayed_ids and window.status.busyLabel.text() == "", 600)
        tokens = len(window.sessionPanel.generatedView.starts)
        print(
            f"demo model, {tokens} tokens ({TOKENS} generated); probe every {PROBE_MS} ms, move every {MOVE_MS} ms"
        )
        print(
            f"{'phase':<28}{'ticks':>7}{'median':>9}{'p95':>8}{'p99':>8}{'worst':>8}{'moves':>7}{'shown':>7}{'settle':>9}"
        )
        phases = (
            ("idle", False, None),
            ("drag, recompress only", True, False),
            ("drag, auto-regenerate", True, True),
        )
        for name, drag, regenerate in phases:
            if regenerate is not None:
                window.controls.autoRegenerateCheck.setChecked(regenerate)
                _wait(app, lambda: window.status.busyLabel.text() == "", 120)
            r = _phase(app, window, seconds, drag)
            print(
                f"{name:<28}{r['ticks']:>7}{r['median']:>7.2f}ms{r['p95']:>6.1f}ms{r['p99']:>6.1f}ms"
                f"{r['worst']:>6.1f}ms{r['moves']:>7}{r['shown']:>7}{r['settle']:>7.0f}ms"
            )
        window.close()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 8.0)
