"""The BLAS loader runs before mlx, says once which BLAS is in use, and can be turned off."""

import ctypes
import subprocess
import sys

_CODE = (
    "import logging; logging.basicConfig(level=logging.INFO, format='%(message)s');"
    "import kvcore, kvcore.blas; kvcore.blas.load_optimized_blas(); import mlx.core"
)


def _log_lines(env_extra: dict) -> list[str]:
    import os

    env = dict(os.environ, **env_extra)
    out = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, env=env, check=True)
    return [line for line in out.stderr.splitlines() if line.startswith("BLAS in use")]


def _openblas_available() -> bool:
    try:
        ctypes.CDLL("libopenblas.so.0")
    except OSError:
        return False
    return True


def test_blas_named_once_in_log():
    lines = _log_lines({"KVLENS_NO_OPENBLAS": "0"})
    assert len(lines) == 1
    if sys.platform == "linux" and _openblas_available():
        assert "openblas" in lines[0]
    elif sys.platform == "darwin":
        assert "accelerate" in lines[0]


def test_opt_out_keeps_reference_blas():
    lines = _log_lines({"KVLENS_NO_OPENBLAS": "1"})
    if sys.platform == "linux":
        assert lines == ["BLAS in use: reference (bundled; KVLENS_NO_OPENBLAS=1)"]
