"""A 7-method × 5-ratio × 2-bits sweep in the real window on the demo model at ~1k prompt tokens: time per
configuration, and how late the GUI event loop runs while the sweep streams its points into the frontier plot.

The sweep is started from the Sweep dock (Run), exactly as a user does; a 5 ms QTimer probe records each tick's
lateness while it runs (benchmarks.event_loop_latency.lateness_until), and once more for the same time with the
window idle, side by side. The target: median lateness ≤ 20 ms while sweeping.
Run: QT_QPA_PLATFORM=offscreen .venv/bin/python -m benchmarks.sweep_latency [prompt tokens] [generated tokens]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from benchmarks.event_loop_latency import PROBE_MS, _wait, lateness_until, percentile  # noqa: E402

METHODS = ["streaming_llm", "snapkv", "h2o", "tova", "knorm", "pyramidkv", "adakv"]
RATIOS = "0.1,0.25,0.4,0.55,0.75"
BITS = "4,16"
TARGET_MEDIAN_MS = 20.0


def _prompt(tokenizer_encode, n_tokens: int) -> str:  # noqa: ANN001
    """The bundled long-identifier sample, repeated and cut to about `n_tokens` tokens."""
    from kvcore.resources import prompts_dir

    text = (prompts_dir() / "long_identifier.txt").read_text(encoding="utf-8")
    while len(tokenizer_encode(text)) < n_tokens:
        text += "\n\n" + text
    lines, out = text.splitlines(keepends=True), ""
    for line in lines:
        if len(tokenizer_encode(out + line)) > n_tokens:
            break
        out += line
    return out


def _row(name: str, late: list[float]) -> str:
    return (
        f"{name:<22}{len(late):>7}{statistics.median(late):>8.2f}ms{percentile(late, 0.95):>7.1f}ms"
        f"{percentile(late, 0.99):>7.1f}ms{max(late):>7.1f}ms"
    )


def main(prompt_tokens: int = 1024, generated: int = 16) -> None:
    from PySide6.QtWidgets import QApplication

    from app.window.main_window import MainWindow, default_model
    from kvcore.model.loading import load

    if default_model() is None:
        sys.exit("The demo model is missing (resources/models/kvlens-demo).")
    app = QApplication.instance() or QApplication([])
    _, tokenizer, _ = load(default_model())
    prompt = _prompt(tokenizer.encode, prompt_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        window = MainWindow(settings_path=Path(tmp) / "settings.json", continuation_tokens=generated)
        window.sessionPanel.chatTemplateCheck.setChecked(False)
        window.show()
        _wait(app, lambda: window.model_info is not None, 120)
        window.prefill(prompt)
        _wait(app, lambda: window.displayed_ids and window.status.busyLabel.text() == "", 600)
        n_prompt = len(window.sessionPanel.generatedView.starts) - generated
        panel = window.sweepPanel
        panel.set_methods(METHODS)
        panel.ratiosEdit.setText(RATIOS)
        panel.bitsEdit.setText(BITS)
        total = len(METHODS) * len(RATIOS.split(",")) * len(BITS.split(","))
        start = time.perf_counter()
        window.sweeping.run()
        sweeping = lateness_until(lambda: not window.sweeping.running, timeout=3600)
        wall = time.perf_counter() - start
        points = window.sweeping.points()
        if len(points) != total:
            sys.exit(f"the sweep stopped after {len(points)} of {total} points: {window.last_error}")
        idle = lateness_until(lambda: False, timeout=min(wall, 10.0))

        seconds = [p.seconds for p in points]
        print(
            f"demo model, {n_prompt} prompt tokens, {generated} generated; {len(METHODS)} methods × "
            f"{len(RATIOS.split(','))} ratios × {len(BITS.split(','))} bits = {total} configurations"
        )
        print(
            f"sweep wall time {wall:.1f} s (prefill excluded); per configuration (compress + regenerate): "
            f"median {statistics.median(seconds) * 1e3:.0f} ms, mean {statistics.mean(seconds) * 1e3:.0f} ms, "
            f"min {min(seconds) * 1e3:.0f} ms, max {max(seconds) * 1e3:.0f} ms"
        )
        print("per method, median ms (first point of a method includes its scoring):")
        for method in METHODS:
            mine = [p for p in points if p.config.method == method]
            rec = statistics.median(p.metrics["recompress_ms"] for p in mine)
            reg = statistics.median(p.metrics["regenerate_ms"] for p in mine)
            print(
                f"  {method:<14} point {statistics.median(p.seconds for p in mine) * 1e3:>6.0f}"
                f"  first {mine[0].seconds * 1e3:>6.0f}  recompress {rec:>6.1f}  regenerate {reg:>6.0f}"
            )
        print(f"\nGUI event loop, probe every {PROBE_MS} ms")
        print(f"{'phase':<22}{'ticks':>7}{'median':>10}{'p95':>9}{'p99':>9}{'worst':>9}")
        print(_row("idle", idle))
        print(_row("sweeping", sweeping))
        median = statistics.median(sweeping)
        verdict = "yes" if median <= TARGET_MEDIAN_MS else "NO"
        print(
            f"median lateness while sweeping {median:.2f} ms (idle {statistics.median(idle):.2f} ms); "
            f"target ≤ {TARGET_MEDIAN_MS:.0f} ms: {verdict}; frontier {len(window.sweepPanel.frontier.frontier())} "
            f"of {total} points"
        )
        window.close()


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    main(*args)
