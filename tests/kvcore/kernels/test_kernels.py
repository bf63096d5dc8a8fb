"""The CUDA kernels' switch: off on a CPU whatever the environment says, and scoped by `switched`."""

import os

import mlx.core as mx

from kvcore import kernels
from kvcore.defaults import FUSED_KERNELS_ENV


def test_cpu_never_runs_the_kernels_and_switched_restores_the_environment(monkeypatch):
    monkeypatch.delenv(FUSED_KERNELS_ENV, raising=False)
    assert mx.default_device().type == mx.cpu
    with kernels.switched(True):
        assert os.environ[FUSED_KERNELS_ENV] == "1"
        assert not kernels.cuda_ready()  # no CUDA here: the operations path runs
    assert FUSED_KERNELS_ENV not in os.environ
    monkeypatch.setenv(FUSED_KERNELS_ENV, "1")
    with kernels.switched(False):
        assert os.environ[FUSED_KERNELS_ENV] == "0"
    assert os.environ[FUSED_KERNELS_ENV] == "1"


def test_float_literal_round_trips():
    for x in (128**-0.5, 0.1, 1 / 3, 1e-7):
        text = kernels.float_literal(x)
        assert text.endswith("f") and float(text[:-1]) == x


def test_scale_source_bakes_scale_times_log2e_and_tags_each_scale():
    tag, line = kernels.scale_source(128**-0.5)
    value = float(line.split("=")[1].strip().rstrip(";f"))
    assert abs(value - 128**-0.5 * 1.4426950408889634) < 1e-15
    assert tag != kernels.scale_source(64**-0.5)[0] and "." not in tag
