"""`make run` without a display explains itself in one line instead of a Qt abort."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(sys.platform != "linux", reason="the display check is Linux-only (macOS always has one)")
def test_make_run_without_display_says_how(tmp_path):
    if shutil.which("make") is None:
        pytest.fail("make is needed: it is the project's entry point")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    proc = subprocess.run(
        ["make", "-s", "run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines[-1] == "No display found. Run it under a virtual screen: xvfb-run -a make run"
    assert "Traceback" not in proc.stderr and "qt.qpa" not in proc.stderr
