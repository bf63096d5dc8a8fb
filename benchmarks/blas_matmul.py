"""mlx CPU matmul GFLOP/s with and without the optimized BLAS that kvcore loads, side by side in one run.

Each variant runs in its own process because the BLAS is chosen when mlx is first imported.
Run: .venv/bin/python -m benchmarks.blas_matmul
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_CHILD = r"""
import json, time
import kvcore
from kvcore.blas import BLAS_IN_USE
import mlx.core as mx
n = 1024
mx.random.seed(0)
a = mx.random.normal((n, n)); b = mx.random.normal((n, n))
mx.eval(a, b)
mx.eval(a @ b)
times = []
for _ in range(10):
    t = time.perf_counter(); c = a @ b; mx.eval(c); times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"blas": BLAS_IN_USE, "gflops": 2 * n**3 / times[len(times) // 2] / 1e9,
                  "corner": c[:8, :8].tolist()}))
"""


def measure(no_openblas: bool) -> dict:
    env = dict(os.environ, KVLENS_NO_OPENBLAS="1" if no_openblas else "0")
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _close(a: list, b: list) -> bool:
    import numpy as np

    return bool(np.allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-3))


def main() -> None:
    ref, opt = measure(True), measure(False)
    print(f"{'BLAS':<70} {'GFLOP/s':>8}")
    for r in (ref, opt):
        print(f"{r['blas']:<70} {r['gflops']:8.1f}")
    print(
        f"speed-up: {opt['gflops'] / ref['gflops']:.1f}x; results equal (rtol 1e-4): {_close(ref['corner'], opt['corner'])}"
    )


if __name__ == "__main__":
    main()
