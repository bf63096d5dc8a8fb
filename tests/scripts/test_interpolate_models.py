"""Weight interpolation writes (1 - w)·A + w·B tensor by tensor, in B's layout, as a model the loader runs."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kvcore.model import loading
from scripts import interpolate_models
from tests.model_factory import build_model


def _weights(folder):
    out = {}
    for shard in sorted(folder.glob("model*.safetensors")):
        out.update(mx.load(str(shard)))
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("interp")
    return build_model(root / "a", seed=0), build_model(root / "b", seed=1)


@pytest.mark.parametrize("weight", [0.0, 0.25, 1.0])
def test_each_tensor_is_the_weighted_mean(pair, tmp_path, weight):
    a, b = pair
    out = tmp_path / "mixed"
    assert interpolate_models.interpolate(a, b, weight, out) == ["model.safetensors"]
    wa, wb, mixed = _weights(a), _weights(b), _weights(out)
    assert not mx.array_equal(wa["model.embed_tokens.weight"], wb["model.embed_tokens.weight"]).item()
    assert mixed.keys() == wb.keys()
    for name, tensor in mixed.items():
        want = (1 - weight) * wa[name] + weight * wb[name]
        assert mx.allclose(tensor, want, atol=1e-6).item(), name
    model, tokenizer, _ = loading.load(str(out))
    logits = model(mx.array([tokenizer.encode("def main(argv):")]))
    assert logits.shape[-1] == wb["model.embed_tokens.weight"].shape[0]


def test_models_of_another_shape_are_refused(pair, tmp_path):
    a, _ = pair
    other = build_model(tmp_path / "wide", seed=2, intermediate_size=320)
    with pytest.raises(ValueError, match="not one shape"):
        interpolate_models.interpolate(a, other, 0.5, tmp_path / "mixed")


def test_weight_outside_zero_one_is_refused(pair, tmp_path, capsys):
    a, b = pair
    with pytest.raises(SystemExit):
        interpolate_models.main([str(a), str(b), "--weight", "1.5", "--out", str(tmp_path / "m")])
    assert "B's share in [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
