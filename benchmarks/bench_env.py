"""The machine, the heatmap refresh (item 6) and a BLAS on/off subset, each measured in its own process."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from typing import Any

from benchmarks.common import ROOT, Row


def machine() -> dict[str, Any]:
    """CPU model, cores, memory, MLX / mlx-lm versions and the BLAS kvcore loaded."""
    import mlx.core as mx
    import mlx_lm

    from kvcore.blas import BLAS_IN_USE

    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        found = re.search(r"model name\s*:\s*(.+)", text)
        cpu = found.group(1).strip() if found else cpu
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else 0
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "device": str(mx.default_device()),
        "blas": BLAS_IN_USE,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def heatmap() -> list[Row]:
    """Run benchmarks.heatmap_refresh (Qt, offscreen) and read its two figures."""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.heatmap_refresh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        return [Row(bench="heatmap", case="refresh", note=f"failed: {proc.stderr.strip().splitlines()[-1:]}")]
    lut = float(re.search(r"LUT.*?:\s*([\d.]+) ms", proc.stdout).group(1))
    naive = float(re.search(r"naive.*?:\s*([\d.]+) ms", proc.stdout).group(1))
    row = Row(
        bench="heatmap", case="32x8 rows x 8192 positions, LUT push", value=lut, unit="ms", target="< 16 ms"
    )
    row.ok = "yes" if lut < 16 else "NO"
    row.note = "benchmarks/heatmap_refresh.py, median of 20"
    return [row, Row(bench="heatmap", case="naive float colormap push", value=naive, unit="ms")]


def blas_subset(quick: bool) -> list[Row]:
    """The --subset rows with OpenBLAS and with the bundled reference BLAS (KVLENS_NO_OPENBLAS=1)."""
    rows = []
    for off in ("0", "1"):
        env = dict(os.environ, KVLENS_NO_OPENBLAS=off)
        cmd = [sys.executable, "-m", "benchmarks.run_all", "--subset"] + (["--quick"] if quick else [])
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode:
            rows.append(
                Row(bench="blas", case=f"subset failed (KVLENS_NO_OPENBLAS={off})", note=proc.stderr[-200:])
            )
            continue
        for d in json.loads(proc.stdout.strip().splitlines()[-1]):
            d["bench"] = "blas: " + d["bench"]
            rows.append(Row(**d))
    return rows
