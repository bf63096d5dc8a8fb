"""A method is one file: a copy of a method file under a new class and name is a new method everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcore import methods
from kvcore.cli.main import main
from kvcore.engine.session import CompressionConfig
from tests.conftest import STRIDED_METHOD


def _copy_snapkv(folder: Path) -> None:
    """snapkv.py as it is, with only its class and method names changed."""
    source = (Path(methods.__file__).parent / "snapkv.py").read_text()
    assert source.count("class SnapKV(Method)") == 1 and source.count('name = "snapkv"') == 1
    copy = source.replace("class SnapKV(Method)", "class SnapKVCopy(Method)").replace(
        'name = "snapkv"', 'name = "snapkv_copy"'
    )
    (folder / "snapkv_copy.py").write_text(copy)


def _compress(model: Path, prompt: Path, out: Path, *extra: str) -> int:
    argv = [
        "compress",
        "--model",
        str(model),
        "--prompt-file",
        str(prompt),
        "--ratio",
        "0.4",
        "--tokens",
        "3",
    ]
    return main([*argv, "--positions", str(out), "--json", *extra])


def test_a_copied_method_file_is_accepted_by_the_cli(
    method_folder, model_dirs, prompt_file, tmp_path, capsys
):
    assert "snapkv_copy" not in methods.available()
    _copy_snapkv(method_folder)
    methods.available.cache_clear()
    methods._classes.cache_clear()
    assert {"snapkv_copy", "adakv-snapkv_copy"} <= set(methods.available())
    copy, original = tmp_path / "copy.json", tmp_path / "original.json"
    assert _compress(model_dirs["llama"], prompt_file, copy, "--method", "snapkv_copy") == 0
    assert json.loads(capsys.readouterr().out)["method"] == "snapkv_copy"
    assert _compress(model_dirs["llama"], prompt_file, original, "--method", "snapkv") == 0
    assert json.loads(copy.read_text())["layers"] == json.loads(original.read_text())["layers"]
    assert (
        _compress(model_dirs["llama"], prompt_file, copy, "--method", "snapkv_copy", "--param", "kernel=3")
        == 0
    )


def test_a_new_parameter_is_a_cli_param(method_folder, model_dirs, prompt_file, tmp_path, capsys):
    (method_folder / "strided.py").write_text(STRIDED_METHOD)
    out = tmp_path / "kept.json"
    argv = ["--method", "strided", "--param", "stride=4", "--ratio", "0.5"]
    assert _compress(model_dirs["llama"], prompt_file, out, *argv) == 0
    kept = json.loads(out.read_text())["layers"][0]["heads"][0]
    assert sum(p % 4 == 0 for p in kept) == len([p for p in range(max(kept) + 1) if p % 4 == 0])
    capsys.readouterr()
    assert _compress(model_dirs["llama"], prompt_file, out, "--method", "strided", "--param", "stride=0") == 2
    assert "stride must be an integer >= 1, got 0" in capsys.readouterr().err
    assert _compress(model_dirs["llama"], prompt_file, out, "--method", "strided", "--param", "beta=2") == 2
    assert "strided has no such parameter (declared: stride)" in capsys.readouterr().err


def test_config_carries_the_declared_parameters(method_folder):
    (method_folder / "strided.py").write_text(STRIDED_METHOD)
    config = CompressionConfig("strided", 0.5, params={"stride": 5})
    assert config.method_instance.stride == 5
    assert CompressionConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match=r"strided has no parameter alpha \(its parameters: stride\)"):
        CompressionConfig("strided", 0.5, params={"alpha": 0.1})
    assert (
        CompressionConfig("adakv-strided", 0.5, params={"stride": 2, "alpha": 0.5}).method_instance.alpha
        == 0.5
    )


def test_every_method_declares_help_and_a_description():
    for name in methods.available():
        method = methods.get(name)
        assert methods.describe(name), name
        for p in method.parameters():
            assert p.help and isinstance(p.default, p.kind), (name, p)
            method.with_values(**{p.name: p.default})  # the declared default passes the declared limits


def test_every_method_declares_its_own_definition_and_paper():
    """On the class itself, so a method built on another (pyramidkv on snapkv) never cites the other's paper by
    inheritance; a wrapper's names its inner method's too."""
    for cls in methods._classes().values():
        for field in ("description", "paper"):
            assert field in vars(cls) and vars(cls)[field].strip(), (cls.name, field)
    assert methods.paper("adakv-h2o") == f"{methods.get('adakv').paper}; over h2o: {methods.get('h2o').paper}"


def test_two_methods_with_one_name_are_refused(method_folder):
    source = (Path(methods.__file__).parent / "knorm.py").read_text()
    (method_folder / "knorm_again.py").write_text(source.replace("class KNorm(", "class KNormAgain("))
    with pytest.raises(ValueError, match="two methods are named 'knorm'"):
        methods.available()


def test_no_method_declares_a_parameter_name_twice():
    """A wrapper's parameters and its inner method's share one namespace (`--param NAME=VALUE`, the GUI's boxes),
    so a name both declare could only ever set one of them."""
    for name in methods.available():
        names = [p.name for p in methods.get(name).parameters()]
        assert len(names) == len(set(names)), (name, names)
