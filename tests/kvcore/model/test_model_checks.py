"""Refusals before any prefill: exit 2 and one line with the fix, no file written, on real tiny models."""

import json
import shutil

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from kvcore.cli.main import main
from kvcore.engine.session import CompressionConfig, Session
from tests.model_factory import build_model

PROMPT = "def main(argv): return sum(x * x for x in argv) The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("sinks") / "gpt_oss", "gpt_oss")


@pytest.fixture
def prefills(monkeypatch):
    """Every Session.prefill call the CLI makes (the real one runs)."""
    calls = []
    original = Session.prefill

    def recording(self, *args, **kwargs):
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Session, "prefill", recording)
    return calls


def _refused(folder, tmp_path, capsys, prefills, *extra) -> str:
    """Run `compress` with a CSV output; assert exit 2, one line, no prefill, no file; return the line."""
    out = tmp_path / "stats.csv"
    argv = ["compress", "--model", str(folder), "-p", PROMPT, "--tokens", "2", "--csv", str(out), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlens: error:") and "\n" not in err
    assert not prefills and not out.exists()
    return err


def _edited_copy(source, folder, **changes):
    """A copy of a model folder with config.json keys changed (None removes the key)."""
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_quantized_kv_with_attention_sinks_is_refused_before_prefill(gpt_oss_dir, tmp_path, capsys, prefills):
    err = _refused(gpt_oss_dir, tmp_path, capsys, prefills, "--bits", "4", "--group-size", "32")
    assert "gpt_oss has attention sinks" in err and "choose 16 bits" in err


def test_attention_sinks_run_unquantized_and_the_session_refuses_bits(gpt_oss_dir, tmp_path):
    out = tmp_path / "stats.csv"
    assert (
        main(["compress", "--model", str(gpt_oss_dir), "-p", PROMPT, "--tokens", "2", "--csv", str(out)]) == 0
    )
    assert out.exists()
    session = Session.load(str(gpt_oss_dir))
    assert session.info.attention_sinks
    with pytest.raises(ValueError, match="attention sinks"):
        session.check_config(CompressionConfig(bits=4, group_size=32))


def test_config_without_model_type_names_the_file(model_dirs, tmp_path, capsys, prefills):
    folder = _edited_copy(model_dirs["llama"], tmp_path / "m", model_type=None)
    err = _refused(folder, tmp_path, capsys, prefills)
    assert f"{folder / 'config.json'} has no 'model_type'" in err and '"model_type": "llama"' in err


def test_unknown_family_is_refused(model_dirs, tmp_path, capsys, prefills):
    folder = _edited_copy(model_dirs["llama"], tmp_path / "m", model_type="no_such_family")
    assert "'no_such_family'" in _refused(folder, tmp_path, capsys, prefills)


def _missing_and_extra(folder):
    """Parameter names the model built from config.json has that the weights lack, and the reverse."""
    import importlib

    config = json.loads((folder / "config.json").read_text())
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    wanted = {k for k, _ in tree_flatten(module.Model(module.ModelArgs.from_dict(config)).parameters())}
    stored = set(mx.load(str(folder / "model.safetensors")))
    return sorted(wanted - stored), sorted(stored - wanted)


@pytest.mark.parametrize("layers, kind", [(6, "missing"), (2, "are not in the model")])
def test_weights_that_do_not_match_the_config_name_five_and_the_count(
    model_dirs, tmp_path, capsys, prefills, layers, kind
):
    folder = _edited_copy(model_dirs["llama"], tmp_path / "m", num_hidden_layers=layers)
    missing, extra = _missing_and_extra(folder)
    names = missing or extra
    err = _refused(folder, tmp_path, capsys, prefills)
    assert f"{len(names)} parameters" in err and kind in err and ", ".join(names[:5]) + ", …" in err
    assert names[5] not in err and "use the config.json that came with these weights" in err


def test_quantized_weights_without_quantization_config(model_dirs, tmp_path, capsys, prefills):
    from mlx_lm import convert

    q = tmp_path / "q4"
    convert(str(model_dirs["llama"]), mlx_path=str(q), quantize=True, q_bits=4, q_group_size=32)
    config = json.loads((q / "config.json").read_text())
    assert config["quantization"]["bits"] == 4
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    (q / "config.json").write_text(json.dumps(config))
    err = _refused(q, tmp_path, capsys, prefills)
    assert "weights are quantized" in err and "has no 'quantization' entry" in err and ".scales" in err


@pytest.fixture(scope="module")
def mla_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("mla") / "v3", "deepseek_v3")


@pytest.mark.parametrize("model_type", ["deepseek_v3", "kimi_k2"])
def test_quantized_kv_on_latent_attention_is_refused_before_prefill(
    mla_dir, tmp_path, capsys, prefills, model_type
):
    folder = _edited_copy(mla_dir, tmp_path / "mla", model_type=model_type)
    err = _refused(folder, tmp_path, capsys, prefills, "--bits", "4", "--group-size", "32")
    assert f"{model_type} uses multi-head latent attention" in err and "choose 16 bits" in err


@pytest.mark.parametrize("model_type, module", [("glm4_moe_lite", "glm4_moe_lite"), ("kimi_k25", "kimi_k25")])
def test_latent_attention_kv_lens_cannot_observe_is_refused_before_the_weights_load(
    mla_dir, tmp_path, capsys, prefills, model_type, module
):
    folder = _edited_copy(mla_dir, tmp_path / "mla", model_type=model_type)
    err = _refused(folder, tmp_path, capsys, prefills)
    assert f"{model_type} uses multi-head latent attention (MLA)" in err and f"mlx-lm's {module}.py" in err
    assert "choose deepseek_v3 / kimi_k2 or a model with standard attention" in err
