"""Shared fixtures: real mlx-lm models with random weights, built once per test session."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

import kvcore  # noqa: E402,F401  (loads the optimized BLAS before mlx)
from tests.model_factory import build_model  # noqa: E402


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """{"llama": folder, "qwen3": folder}: GQA models written to disk for mlx_lm.load."""
    root = tmp_path_factory.mktemp("models")
    return {arch: build_model(root / arch, arch) for arch in ("llama", "qwen3")}


@pytest.fixture(scope="session")
def loaded_models(model_dirs):
    """{"llama": (model, tokenizer), ...} loaded through the real mlx_lm.load."""
    import mlx_lm

    return {arch: mlx_lm.load(str(path)) for arch, path in model_dirs.items()}
