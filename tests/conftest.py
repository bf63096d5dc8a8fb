"""Shared fixtures: real mlx-lm models with random weights, built once per test session."""

from __future__ import annotations

import os
import sys

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


def package_folder(package, tmp_path, monkeypatch):
    """A folder on `package`'s path (kvcore.methods or kvcore.quant): a file written there is a module of the
    package, as a new file in it would be. Discovery is cleared before and after, so no other test sees it."""
    folder = tmp_path / f"more_{package.__name__.rsplit('.', 1)[1]}"
    folder.mkdir()
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    package._classes.cache_clear()
    package.available.cache_clear()
    yield folder
    monkeypatch.undo()
    stems = {p.stem for p in folder.glob("*.py")}
    for name in [
        m for m in sys.modules if m.startswith(f"{package.__name__}.") and m.rsplit(".", 1)[1] in stems
    ]:
        del sys.modules[name]
    package._classes.cache_clear()
    package.available.cache_clear()


@pytest.fixture
def method_folder(tmp_path, monkeypatch):
    """A folder whose method files are methods of kvcore.methods (package_folder)."""
    from kvcore import methods

    yield from package_folder(methods, tmp_path, monkeypatch)


#: A method with a parameter no built-in method has: keep every stride-th position (and the last ones).
STRIDED_METHOD = """
from dataclasses import dataclass

import mlx.core as mx

from kvcore.declared import param
from kvcore.methods.base import Method


@dataclass(frozen=True)
class Strided(Method):
    name = "strided"
    description = "Every stride-th position"

    stride: int = param(3, "keep every stride-th position", minimum=1)

    def scores(self, obs, layer):
        on_stride = (mx.arange(obs.n_tokens) % self.stride == 0).astype(mx.float32)
        return mx.broadcast_to(on_stride, (obs.n_kv_heads, obs.n_tokens))
"""
