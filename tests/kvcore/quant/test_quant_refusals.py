"""Bad input to the schemes: each refusal is one line that names what is allowed."""

import mlx.core as mx
import pytest

from kvcore.cache.kivi import kivi_cache
from kvcore.engine.session import CompressionConfig
from kvcore.quant import get


@pytest.mark.parametrize(
    "spec, bits, head_dim, message",
    [
        (
            "kivi",
            7,
            64,
            r"bits=7 is not supported: kivi \(affine codes, keys per channel\) allows bits in \(2, 3, 4, 5, 6, 8\)",
        ),
        (
            "mxfp8",
            4,
            64,
            r"bits=4 is not supported: mxfp8 \(mx.quantize mode 'mxfp8'\) allows bits in \(8,\)",
        ),
        (
            "rotated:packing=nvfp4",
            2,
            64,
            r"bits=2 is not supported: rotated with packing nvfp4 allows bits in \(4,\)",
        ),
        (
            "rotated",
            4,
            36,
            r"head_dim=36 is not supported: the rotated scheme's Hadamard rotation takes head_dim = 2\^k",
        ),
        ("rotated:packing=mxfp4", 4, 48, r"group_size=32 does not divide head_dim=48: .* use one of none"),
        ("kivi:residual=8", 4, 96, r"group_size=64 does not divide head_dim=96: .* use one of \[32\]"),
    ],
)
def test_a_width_group_or_head_dim_a_scheme_cannot_take(spec, bits, head_dim, message):
    scheme = get(spec, group_size=64) if spec.startswith("kivi:") else get(spec)
    with pytest.raises(ValueError, match=message) as e:
        scheme.check(bits, head_dim)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "spec, kwargs, message",
    [
        (
            "kivi",
            {"group_size": 48},
            r"group_size=48 is not supported: kivi \(.*\) allows group sizes \(32, 64, 128\)",
        ),
        ("kivi:residual=-1", {}, r"residual must be an integer >= 0, got -1"),
        ("rotated:packing=fp8", {}, r"packing must be one of affine, mxfp4, nvfp4, mxfp8, got 'fp8'"),
        ("kivi:window=3", {}, r"write kivi:NAME=VALUE,… with NAME one of group_size, residual"),
    ],
)
def test_a_parameter_a_scheme_does_not_take(spec, kwargs, message):
    with pytest.raises(ValueError, match=message):
        get(spec, **kwargs)


def test_config_refuses_a_width_the_scheme_does_not_pack():
    with pytest.raises(ValueError, match=r"rotated:packing=mxfp4: bits must be one of \(4,\) or 16"):
        CompressionConfig(bits=8, quant="rotated:packing=mxfp4")


def test_kivi_token_groups_and_residual():
    with pytest.raises(ValueError, match="kivi packs whole token groups: 40 tokens is not a multiple of 32"):
        get("kivi").pack_keys(mx.zeros((1, 1, 40, 64)), 4)
    from mlx_lm.models.cache import KVCache

    layer = KVCache()
    layer.update_and_fetch(mx.zeros((1, 1, 20, 64)), mx.zeros((1, 1, 20, 64)))
    with pytest.raises(
        ValueError, match=r"^kivi: residual=32 is longer than the 20 positions to store: use residual <= 20"
    ):
        kivi_cache([layer], "kivi:residual=32", 4)
