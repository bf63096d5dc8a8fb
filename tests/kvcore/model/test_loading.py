"""Model loading: real folders through mlx_lm.load, and a clear one-line error for each kind of bad input."""

import json
import shutil

import pytest

from kvcore.model.loading import ModelLoadError, hf_cache_dir, load, resolve


def test_loads_folder_and_reports_shapes(model_dirs):
    model, tok, info = load(str(model_dirs["llama"]))
    assert (info.n_layers, info.n_q_heads, info.n_kv_heads, info.head_dim) == (4, 4, 2, 32)
    assert info.max_context == 4096
    assert tok.encode("def")


def test_finds_model_in_hf_cache(model_dirs, tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    shutil.copytree(model_dirs["qwen3"], snap)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hf_cache_dir() == tmp_path / "hub"
    assert resolve("org/tiny") == snap
    _, _, info = load("org/tiny")
    assert info.model_type == "qwen3"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HF_HUB_CACHE": "a", "HUGGINGFACE_HUB_CACHE": "b", "HF_HOME": "c"}, "a"),
        ({"HF_HUB_CACHE": "", "HUGGINGFACE_HUB_CACHE": "b", "HF_HOME": "c"}, "b"),
        ({"HF_HOME": "c", "XDG_CACHE_HOME": "x"}, "c/hub"),
        ({"HF_HOME": "", "XDG_CACHE_HOME": "x"}, "x/huggingface/hub"),
        ({}, "home/.cache/huggingface/hub"),
    ],
)
def test_hf_cache_dir_follows_huggingface_hub_precedence(env, expected, tmp_path, monkeypatch):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, str(tmp_path / value) if value else "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hf_cache_dir() == tmp_path / expected


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p, "not a model folder"),
        (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "is a file"),
        (lambda p: p / "missing", "no such folder"),
        (lambda p: (p / "config.json").write_text("{}") and p, "no \\*.safetensors"),
    ],
)
def test_bad_folders_are_explained(tmp_path, make, message):
    with pytest.raises(ModelLoadError, match=message):
        resolve(str(make(tmp_path)))


def test_unknown_architecture_is_explained(model_dirs, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(model_dirs["llama"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "not_a_real_arch"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelLoadError, match="'not_a_real_arch' in .*config.json is not an architecture mlx-lm"
    ):
        load(str(bad))


def test_uncached_repo_without_network_is_explained(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        load("nobody/no-such-model")


def test_half_precision_runs_in_float32_on_cpu(tmp_path):
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from tests.model_factory import build_model

    folder = build_model(tmp_path / "bf16", "llama", dtype="bfloat16")
    model, _, _ = load(str(folder))
    dtypes = {v.dtype for _, v in tree_flatten(model.parameters())}
    if mx.default_device().type == mx.DeviceType.cpu:
        assert dtypes == {mx.float32}
    else:
        assert dtypes == {mx.bfloat16}
