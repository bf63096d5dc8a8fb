"""Make docs/screenshot.png: the real window at 1280×800 (a 13-inch laptop) after a prefill and a compression on
the demo model, under Xvfb.

Run `make screenshot` (or `python scripts/screenshot.py [out.png] [--size=1920x1080]`); with `--sweep` it also runs a sweep from the
Sweep dock and writes docs/sweep.png (the window with the Sweep dock raised) and docs/frontier.png (the frontier
plot's own export, 1600 px wide), then a needle grid from its dock: docs/needle_grid.png (the window with the grid
raised). With `--questions` it opens the Questions dock on the showcase context (the prompt less its last line) with
three questions about it, answers them, rings the first one's attention in the heatmap and writes
docs/questions.png. With `--timeline` it writes docs/timeline.png instead: a 1,024-token generation under a decoding
policy (TIMELINE) from the Timeline dock, scrubbed half way so the heatmap shows the cache at that step. Without a display it re-runs itself under `xvfb-run` (Qt's xcb plugin needs libxcb-cursor0, libxcb-icccm4
and libxcb-keysyms1 on Debian); settings go to a temporary file, so the user's own settings are never read or written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "screenshot.png"


def _size(argv: list[str]) -> tuple[int, int]:
    """--size=WxH (default 1280x800, a 13-inch laptop; 1920x1080 for a desktop screen)."""
    for arg in argv:
        if arg.startswith("--size="):
            width, _, height = arg.removeprefix("--size=").partition("x")
            return int(width), int(height)
    return 1280, 800


SIZE = _size(sys.argv[1:])
CONFIG = {"method": "snapkv", "ratio": 0.25, "bits": 4, "group_size": 64}
#: The sample whose answer a query-aware method keeps at 25 % and streaming_llm loses (resources/prompts/notes.json).
SHOWCASE = "dict_lookup"
FALLBACK_PROMPT = '''import json
from pathlib import Path


class ConfigurationRegistry:
    """Holds named configurations loaded from JSON files."""

    def __init__(self, root):
        self.root = Path(root)
        self.entries = {}

    def load(self, name):
        path = self.root / f"{name}.json"
        with path.open() as f:
            self.entries[name] = json.load(f)
        return self.entries[name]

    def names(self):
        return sorted(self.entries)


def merge(left, right):
    out = dict(left)
    for key, value in right.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def main(argv):
    registry = ConfigurationRegistry(argv[0])
    for name in argv[1:]:
        registry.load(name)
    return registry.'''


def _needs_display() -> bool:
    return (
        sys.platform.startswith("linux")
        and not os.environ.get("DISPLAY")
        and not os.environ.get("KVLENS_XVFB")
    )


def _rerun_under_xvfb() -> int:
    """Run this script again on a virtual X screen; without Xvfb or Qt's xcb libraries, render offscreen."""
    me = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]]
    xvfb = shutil.which("xvfb-run")
    if xvfb is not None:
        env = dict(os.environ, KVLENS_XVFB="1", QT_QPA_PLATFORM="xcb")
        screen = f"-screen 0 {SIZE[0]}x{SIZE[1]}x24"
        rc = subprocess.call([xvfb, "-a", "-s", screen, *me], env=env)
        if rc >= 0:
            return rc
        print(
            "Qt could not open the Xvfb display (missing xcb libraries? apt-get install libxcb-icccm4 "
            "libxcb-keysyms1 libxcb-cursor0); rendering offscreen instead.",
            file=sys.stderr,
        )
    else:
        print("xvfb-run not found (apt-get install xvfb); rendering offscreen instead.", file=sys.stderr)
    return subprocess.call(me, env=dict(os.environ, KVLENS_XVFB="1", QT_QPA_PLATFORM="offscreen"))


def showcase_prompt() -> Path | None:
    """The showcase sample prompt, else the longest one."""
    from kvcore.resources import prompts_dir

    files = sorted(prompts_dir().glob("*.txt")) if prompts_dir().is_dir() else []
    named = [f for f in files if f.stem == SHOWCASE]
    return named[0] if named else max(files, key=lambda f: f.stat().st_size, default=None)


def _choose_prompt(window) -> None:  # noqa: ANN001
    """Pick the sample prompt through the panel's own combo (so it shows as chosen), else the built-in one."""
    chosen, combo = showcase_prompt(), window.sessionPanel.samplePromptCombo
    index = combo.findData(str(chosen)) if chosen else -1
    if index >= 0:
        combo.setCurrentIndex(index)
        combo.activated.emit(index)
    else:
        window.sessionPanel.promptEdit.setPlainText(FALLBACK_PROMPT)


def _wait(app, condition, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not condition() and time.monotonic() < end:
        app.processEvents()
        time.sleep(0.02)
    return condition()


def main(
    out: Path, sweep: bool = False, questions: bool = False, timeline: bool = False, stored: bool = False
) -> int:
    sys.path.insert(0, str(ROOT))
    from PySide6.QtWidgets import QApplication

    from app.window.main_window import MainWindow, default_model

    if default_model() is None:
        print("The demo model is missing (resources/models/kvlens-demo): nothing to show.", file=sys.stderr)
        return 1
    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("KV Lens")
    with tempfile.TemporaryDirectory() as tmp:
        window = MainWindow(settings_path=Path(tmp) / "settings.json")
        window.move(0, 0)
        window.resize(*SIZE)
        window.show()
        if not _wait(app, lambda: window.model_info is not None, 120):
            print(f"Loading failed: {window.last_error}", file=sys.stderr)
            return 1
        window.controls.set_config(CONFIG)
        if timeline:
            ok = _timeline_shot(app, window, ROOT / "docs" / "timeline.png")
            window.close()
            return 0 if ok else 1
        _choose_prompt(window)
        window.prefill()
        done = _wait(app, lambda: window.displayed_ids and window.status.busyLabel.text() == "", 600)
        if not done:
            print(f"Prefill or compression did not finish: {window.last_error}", file=sys.stderr)
            return 1
        window.heatmap.highlight_position(len(window.sessionPanel.generatedView.starts) - 1)
        _wait(app, lambda: False, 0.5)  # let the last paints land
        out.parent.mkdir(parents=True, exist_ok=True)
        if not window.grab().save(str(out)):
            print(f"Could not write {out}", file=sys.stderr)
            return 1
        if sweep and not _sweep_shots(app, window, out.parent):
            return 1
        if questions and not _questions_shot(app, window, out.parent / "questions.png"):
            return 1
        if stored and not _stored_shots(app, window, out.parent):
            return 1
        window.close()
    print(f"Wrote {out}")
    return 0


SWEEP = {
    "methods": ["streaming_llm", "snapkv", "h2o", "knorm", "pyramidkv"],
    "ratios": "0.1:0.9:0.2",
    "bits": "4,16",
}
#: The bottom row's height while the sweep or the needle grid is shown (as a user drags it up to read the plot).
RUN_DOCK_HEIGHT = 430
FRONTIER_WIDTH = 1600


def _sweep_shots(app, window, folder: Path) -> bool:  # noqa: ANN001
    """Run SWEEP from the dock, then save the floated dock and the frontier plot next to the main screenshot."""
    panel = window.sweepPanel
    panel.set_methods(SWEEP["methods"])
    panel.ratiosEdit.setText(SWEEP["ratios"])
    panel.bitsEdit.setText(SWEEP["bits"])
    window.sweeping.run()
    if not _wait(app, lambda: not window.sweeping.running, 900) or not window.sweeping.points():
        print(f"The sweep did not finish: {window.last_error}", file=sys.stderr)
        return False
    plot = panel.frontier
    front = plot.frontier()
    if front:
        plot._on_mouse_moved(
            plot.scene_position(front[len(front) // 2])
        )  # a hover tooltip's text in the status
    ok = _window_shot(app, window, window.sweepDock, folder / "sweep.png")
    window.sweeping.export_image(folder / "frontier.png", FRONTIER_WIDTH)
    print(f"Wrote {folder / 'sweep.png'} and {folder / 'frontier.png'}")
    return ok and _needle_shot(app, window, folder / "needle_grid.png")


NEEDLE_METHODS = ["snapkv", "streaming_llm", "adakv"]


def _needle_shot(app, window, out: Path) -> bool:  # noqa: ANN001
    """Run the Needle grid dock's defaults (a family, depths and lengths the dense cache recalls) at 25 % for
    NEEDLE_METHODS and save the window with the dock raised."""
    panel = window.needlePanel
    panel.ratiosEdit.setText("0.25")
    panel.set_methods(NEEDLE_METHODS)
    window.needles.run()
    if not _wait(app, lambda: not window.needles.running, 1800) or not window.needles.cells:
        print(f"The needle grid did not finish: {window.last_error}", file=sys.stderr)
        return False
    print(f"Wrote {out}")
    return _window_shot(app, window, window.needleDock, out)


def _window_shot(app, window, dock, out: Path) -> bool:  # noqa: ANN001
    """The whole window with `dock` raised and the bottom row taller."""
    from PySide6.QtCore import Qt

    dock.show()
    dock.raise_()
    window.resizeDocks([dock], [RUN_DOCK_HEIGHT], Qt.Orientation.Vertical)
    _wait(app, lambda: False, 0.5)
    return window.grab().save(str(out))


#: The questions of the Questions shot: keys of the showcase's ROUTES table and the values they map to.
QUESTION_KEYS = {"cache_ibis_hash": "fzi", "tenant_tulip_ref": "xa4h", "queue_fjord_id": "2h34"}
QUESTIONS_CONFIG = {"method": "snapkv", "ratio": 0.25, "bits": 16}


def _questions_shot(app, window, out: Path) -> bool:  # noqa: ANN001
    """Prefill the showcase context (its last line is a question: it goes), answer QUESTION_KEYS from the
    Questions dock at QUESTIONS_CONFIG, ring the first question's attention and save the window."""
    from kvcore.engine.questions import Question

    text = window.sessionPanel.promptEdit.toPlainText()
    context = text[: text.rstrip().rfind("\n") + 1]
    window.controls.set_config(QUESTIONS_CONFIG)
    window.sessionPanel.promptEdit.setPlainText(context)
    before = len(window.displayed_ids)
    window.prefill()
    if not _wait(
        app, lambda: len(window.displayed_ids) > before and window.status.busyLabel.text() == "", 600
    ):
        print(f"The context prefill did not finish: {window.last_error}", file=sys.stderr)
        return False
    panel = window.questionsPanel
    panel.set_questions(
        [Question(f'assert ROUTES["{key}"] == "', value) for key, value in QUESTION_KEYS.items()]
    )
    window.questioning.show_dock()
    window.questioning.run()
    if not _wait(app, lambda: window.questioning.last is not None and not window.questioning.running, 600):
        print(f"The questions were not answered: {window.last_error}", file=sys.stderr)
        return False
    panel.table.selectRow(0)
    window.questioning.mark_attention(0)
    if not _wait(app, lambda: window.heatmap.marks() is not None, 120):
        print(f"The attention was not marked: {window.last_error}", file=sys.stderr)
        return False
    panel.table.clearSelection()  # every row's ✓/✗ colours in view (the status names the ringed question)
    print(f"Wrote {out}")
    return _window_shot(app, window, window.questionsDock, out)


#: The Stored form shots: ThinK over snapkv, then merging over snapkv, at half the positions, unquantized (both rewrite
#: float rows), each with a hover on its view.
STORED_CONFIGS = {"think_channels": "think", "merges": "merging"}
STORED_WIDTH = 980
#: The merges shot shows this many positions either side of the hovered one (token texts readable under them).
STORED_ZOOM = 30


def _stored_shots(app, window, folder: Path) -> bool:  # noqa: ANN001
    """docs/think_channels.png and docs/merges.png: the Stored form dock (grabbed alone, a small image) after
    compressing with each of STORED_CONFIGS, the bottom row taller, one cell hovered (its text in the status)."""
    from PySide6.QtCore import QPointF, Qt

    dock, panel = window.storedDock, window.storedPanel
    dock.show()
    dock.raise_()
    window.resizeDocks([dock], [RUN_DOCK_HEIGHT], Qt.Orientation.Vertical)
    for name, method in STORED_CONFIGS.items():
        before = len(window.displayed_ids)
        window.controls.set_config({**window.controls.config(), "method": method, "ratio": 0.5, "bits": 16})
        if not _wait(
            app, lambda b=before: len(window.displayed_ids) > b and not window.status.busyLabel.text(), 600
        ):
            print(f"{method} did not finish: {window.last_error}", file=sys.stderr)
            return False
        view = panel.currentWidget()
        if method == "merging":
            if not _merge_shots(app, dock, view, folder):
                return False
            continue
        view._on_mouse_moved(view.plot.vb.mapViewToScene(QPointF(view.view().head_dim * 0.3, 2.5)))
        if not _dock_shot(app, dock, folder / f"{name}.png"):
            return False
    return True


def _merge_shots(app, dock, view, folder: Path) -> bool:  # noqa: ANN001
    """docs/merges.png: the evicted × target matrix, a merge hovered; docs/merges_arcs.png: the arcs zoomed in on
    a short merge, as a user reads them."""
    from PySide6.QtCore import QPointF

    pairs = view.arc_pairs()
    short = [p for p in pairs if 0 < abs(p[2] - p[1]) <= 12] or pairs
    head, source, target = short[len(short) // 2] if short else (0, 0, 0)
    view.set_matrix(True)
    view._on_mouse_moved(view.plot.vb.mapViewToScene(QPointF(source + 0.5, target + 0.5)))
    if not _dock_shot(app, dock, folder / "merges.png"):
        return False
    view.set_matrix(False)
    view.plot.setXRange(max(0, source - STORED_ZOOM), source + STORED_ZOOM, padding=0)
    view._on_mouse_moved(view.plot.vb.mapViewToScene(QPointF(source + 0.5, head + 0.5)))
    return _dock_shot(app, dock, folder / "merges_arcs.png")


def _dock_shot(app, dock, out: Path) -> bool:  # noqa: ANN001
    _wait(app, lambda: False, 0.5)
    if not dock.grab().scaledToWidth(min(STORED_WIDTH, dock.width())).save(str(out)):
        print(f"Could not write {out}", file=sys.stderr)
        return False
    print(f"Wrote {out}")
    return True


#: The Timeline shot: a 1,024-token generation under knorm from the full prefill cache of a 611-token sample
#: (prompt and generation fit the demo model's 2,048-token context), one layer × kv-head drawn.
TIMELINE = {"method": "knorm", "budget": 256, "interval": 16, "tokens": 1024}
TIMELINE_PROMPT = "long_identifier"
TIMELINE_HEAD = (4, 1)


def _timeline_shot(app, window, out: Path) -> bool:  # noqa: ANN001
    """Prefill TIMELINE_PROMPT, decode TIMELINE from the Timeline dock, scrub half way, hover a held cell, and save
    the window with the dock raised."""
    from PySide6.QtCore import QPointF

    from kvcore.resources import prompts_dir

    window.sessionPanel.promptEdit.setPlainText((prompts_dir() / f"{TIMELINE_PROMPT}.txt").read_text())
    window.prefill()
    if not _wait(app, lambda: window.displayed_ids and window.status.busyLabel.text() == "", 600):
        print(f"Prefill or compression did not finish: {window.last_error}", file=sys.stderr)
        return False
    panel = window.timelinePanel
    panel.set_policy(TIMELINE["method"], TIMELINE["budget"], TIMELINE["interval"], TIMELINE["tokens"])
    panel.prefillCheck.setChecked(False)
    started = time.monotonic()
    window.timeline.run()
    if not _wait(app, lambda: not window.timeline.running, 1800) or panel.view() is None:
        print(f"The decode did not finish: {window.last_error}", file=sys.stderr)
        return False
    print(f"Decoded {TIMELINE['tokens']} tokens in {time.monotonic() - started:.0f} s")
    view = panel.view()
    panel.set_head(*TIMELINE_HEAD)
    step = view.timeline.n_steps // 2
    panel.set_step(step)
    panel.stepSlider.setFocus()
    ok = _window_shot(app, window, window.timelineDock, out)
    panel._on_mouse_moved(panel.plot.vb.mapViewToScene(QPointF(view.n_prompt // 3 + 0.5, step + 0.5)))
    _wait(app, lambda: False, 0.3)
    ok = ok and window.grab().save(str(out))
    panel.export_image(out.with_name("timeline_plot.png"), FRONTIER_WIDTH)
    print(f"Wrote {out} and {out.with_name('timeline_plot.png')}")
    return ok


if __name__ == "__main__":
    flags = ("--sweep", "--questions", "--timeline", "--stored")
    args = [a for a in sys.argv[1:] if a not in flags and not a.startswith("--size=")]
    target = Path(args[0]) if args else DEFAULT_OUT
    sys.exit(
        _rerun_under_xvfb()
        if _needs_display()
        else main(
            target,
            sweep="--sweep" in sys.argv,
            questions="--questions" in sys.argv,
            timeline="--timeline" in sys.argv,
            stored="--stored" in sys.argv,
        )
    )
