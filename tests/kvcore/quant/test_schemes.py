"""Quantization schemes declare themselves: discovery by module, their limits, one-line refusals, and affine's
packed form against a NumPy reading of it."""

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import kvcore.quant
from kvcore import quantize_cache
from kvcore.defaults import ALLOWED_BITS, ALLOWED_GROUP_SIZES, DEFAULT_GROUP_SIZE
from kvcore.engine.session import CompressionConfig
from kvcore.quant import available, get


def test_the_builtin_schemes_are_found_with_the_default_first():
    names = available()
    assert names[0] == "affine"
    assert {"affine", "mxfp4", "nvfp4", "mxfp8"} <= set(names)
    for name in names:
        scheme = get(name)
        assert scheme.name == name and scheme.description
        assert scheme.execution == ("genuine" if scheme.genuine else "simulated")
    assert {get(n).execution for n in ("affine", "mxfp4", "nvfp4", "mxfp8", "rotated")} == {"genuine"}


@pytest.mark.parametrize(
    "name, bits, group, parts",
    [
        ("affine", ALLOWED_BITS, DEFAULT_GROUP_SIZE, 3),
        ("mxfp4", (4,), 32, 2),
        ("nvfp4", (4,), 16, 2),
        ("mxfp8", (8,), 32, 2),
    ],
)
def test_each_scheme_declares_its_widths_group_and_parts(name, bits, group, parts):
    scheme = get(name)
    assert (scheme.allowed_bits, scheme.group_size, scheme.n_parts) == (bits, group, parts)
    assert [p.name for p in scheme.parameters()] == ["group_size"]
    x = mx.random.normal((2, 3, 64), key=mx.random.key(0))
    packed = scheme.pack(x, bits[0])
    assert len(packed) == parts
    assert scheme.unpack(packed, bits[0]).shape == x.shape


def _numpy_unpack(parts: tuple[mx.array, ...], bits: int, group: int) -> np.ndarray:
    """Affine's definition read in NumPy: codes as a little-endian bit stream of the uint32 words, then
    scale · code + bias per group."""
    words, scales, biases = (np.array(p) for p in parts)
    raw = words.astype("<u4").view(np.uint8)
    stream = np.unpackbits(raw, axis=-1, bitorder="little")
    n = stream.shape[-1] // bits
    codes = stream[..., : n * bits].reshape(*stream.shape[:-1], n, bits)
    codes = (codes.astype(np.int64) << np.arange(bits)).sum(-1)
    scale = np.repeat(scales, group, axis=-1)
    bias = np.repeat(biases, group, axis=-1)
    return codes * scale + bias, scale


@pytest.mark.parametrize("bits", ALLOWED_BITS)
@pytest.mark.parametrize("group", ALLOWED_GROUP_SIZES)
def test_affine_pack_unpack_matches_numpy(bits, group):
    scheme = get("affine", group_size=group)
    x = mx.random.normal((4, 256), key=mx.random.key(bits * group))
    parts = scheme.pack(x, bits)
    want, scale = _numpy_unpack(parts, bits, group)
    got = np.array(scheme.unpack(parts, bits))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # and the codes round to near steps: on average a quarter of a step off (uniform rounding), well under a half
    assert np.mean(np.abs(np.array(x) - want) / np.abs(scale)) < 0.4


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: get("mxfp4").check(8),
            r"bits=8 is not supported: mxfp4 \(mx.quantize mode 'mxfp4'\) allows bits in \(4,\)",
        ),
        (lambda: get("mxfp8").check(4), r"bits=4 is not supported: mxfp8 .* allows bits in \(8,\)"),
        (
            lambda: get("affine").check(7),
            r"bits=7 is not supported: mx.quantize allows bits in \(2, 3, 4, 5, 6, 8\)",
        ),
        (
            lambda: get("affine", group_size=48),
            r"group_size=48 is not supported: mx.quantize allows group sizes \(32, 64, 128\)",
        ),
        (
            lambda: get("nvfp4", group_size=32),
            r"group_size=32 is not supported: nvfp4 .* allows group sizes \(16,\)",
        ),
        (
            lambda: get("affine").check(4, head_dim=96),
            r"group_size=64 does not divide head_dim=96.*use one of \[32\]",
        ),
        (
            lambda: get("mxfp4").check(4, head_dim=48),
            r"group_size=32 does not divide head_dim=48.*mxfp4 cannot pack",
        ),
        (lambda: get("fp3"), r"unknown quantization scheme 'fp3'; available: affine, "),
        (lambda: get("mxfp4", alpha=1), r"mxfp4 has no parameter alpha \(its parameters: group_size\)"),
        (lambda: CompressionConfig(quant="mxfp4", bits=8), r"mxfp4: bits must be one of \(4,\) or 16"),
        (
            lambda: CompressionConfig(quant="nvfp4", bits=4, value_bits=2),
            r"nvfp4: value bits must be one of \(4,\)",
        ),
        (lambda: CompressionConfig(quant="int3"), r"unknown quantization scheme 'int3'"),
    ],
)
def test_bad_input_is_refused_in_one_line_naming_what_is_allowed(make, message):
    with pytest.raises(ValueError, match=message) as info:
        make()
    assert "\n" not in str(info.value)


def test_a_fixed_group_format_sets_the_config_group_and_describes_itself():
    config = CompressionConfig(quant="nvfp4", bits=4, group_size=64)
    assert config.group_size == 16 and config.scheme.group_size == 16
    described = config.describe()
    assert (described["quant_scheme"], described["execution"]) == ("nvfp4", "genuine")
    assert CompressionConfig.from_dict(config.to_dict()) == config


def test_a_copied_scheme_file_under_a_new_name_is_discovered(scheme_folder):
    source = Path(kvcore.quant.__file__).with_name("mxfp4.py").read_text()
    renamed = source.replace('name: ClassVar[str] = "mxfp4"', 'name: ClassVar[str] = "mxfp4_copy"')
    assert renamed != source
    (scheme_folder / "mxfp4_copy.py").write_text(renamed)
    assert "mxfp4_copy" in available()
    copy, original = get("mxfp4_copy"), get("mxfp4")
    x = mx.random.normal((2, 4, 64), key=mx.random.key(3))
    for a, b in zip(copy.pack(x, 4), original.pack(x, 4), strict=True):
        assert mx.array_equal(a, b)
    from mlx_lm.models.cache import KVCache

    layer = KVCache()
    layer.update_and_fetch(x[None], x[None])
    (packed,) = quantize_cache([layer], bits=4, quant="mxfp4_copy")
    assert packed.quant == "mxfp4_copy" and packed.group_size == 32
