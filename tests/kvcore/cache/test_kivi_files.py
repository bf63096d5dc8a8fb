"""A KIVI layer saved and loaded: the packed Kᵀ groups, value groups, positions and float residual come back equal
(a per-head selection of different counts, decoded past a packed group), attention and decoding go on the same; a
forged body is refused in one line naming the layer and the field."""

import json

import mlx.core as mx
import numpy as np
import pytest

from kvcore import load_cache, save_cache
from kvcore.cache import files as cache_io
from kvcore.cache.kivi import KiviKVCache
from kvcore.cache.sparse import select_positions
from tests.kvcore.quant.test_kivi import D, H, _layer

KEPT = [np.arange(100), np.sort(np.r_[np.arange(0, 60, 2), np.arange(60, 100)])]  # 100 and 70 rows a head


def _kivi(bits: int, value_bits: int) -> KiviKVCache:
    layer = select_positions([_layer(100, seed=3)], [KEPT])[0]
    cache = KiviKVCache.from_float(layer, cache_io.scheme_for("kivi:residual=8", 32), bits, value_bits)
    rng = np.random.default_rng(1)
    for _ in range(3):  # appended float rows, and a second group packed for every head
        cache.update_and_fetch(
            *(mx.array(rng.normal(size=(1, H, 1, D)).astype(np.float32)) for _ in range(2))
        )
    return cache


@pytest.mark.parametrize("kb, vb", [(2, 4), (16, 3)])
def test_a_kivi_layer_round_trips_equal(tmp_path, kb, vb):
    cache = _kivi(kb, vb)
    assert cache.n_body == 64 and cache.residual.is_ragged
    path = tmp_path / "kivi.safetensors"
    save_cache(path, [cache], {"note": "kivi"})
    [loaded], meta = load_cache(path)
    assert meta == {"note": "kivi"} and isinstance(loaded, KiviKVCache)
    assert (loaded.quant, loaded.bits, loaded.value_bits, loaded.offset) == ("kivi:residual=8", kb, vb, 103)
    for a, b in zip(cache.body_keys + cache.body_values, loaded.body_keys + loaded.body_values, strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    np.testing.assert_array_equal(loaded.body_positions, cache.body_positions)
    for a, b in zip(cache.retained_positions, loaded.retained_positions, strict=True):
        np.testing.assert_array_equal(a, b)
    assert loaded.nbytes == cache.nbytes
    q = mx.array(np.random.default_rng(2).normal(size=(1, 2 * H, 1, D)).astype(np.float32))
    new = [mx.array(np.random.default_rng(3).normal(size=(1, H, 1, D)).astype(np.float32))] * 2
    for c in (cache, loaded):
        c.update_and_fetch(*new)
    np.testing.assert_array_equal(
        np.array(loaded.attend(q, None, None, 0.125)), np.array(cache.attend(q, None, None, 0.125))
    )


def _forged(path, edit) -> None:
    header = cache_io._read_header(path)
    arrays = dict(mx.load(str(path), format="safetensors"))
    header.pop("sha256")
    edit(header["layers"][0], arrays)
    header["sha256"] = cache_io._digest(header, arrays)
    mx.save_safetensors(str(path), arrays, {"kvlens": json.dumps(header, sort_keys=True)})


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda info, a: info.update(quant="affine"), "a KiviKVCache is packed by a per-channel scheme"),
        (lambda info, a: info.update(n_body=40), "n_body 40 is not whole groups of 32 tokens"),
        (
            lambda info, a: a.update({"0.body_positions": a["0.body_positions"] + 90}),
            "head 0's body positions must increase from 0 and come before its residual's",
        ),
        (
            lambda info, a: a.update({"0.body_keys.1": a["0.body_keys.1"][..., :1]}),
            r"body_keys.1 is mlx.core.float32 \[1, 2, 64, 1\], expected",
        ),
        (lambda info, a: a.pop("0.body_values.2"), "body arrays"),
    ],
)
def test_a_forged_kivi_body_is_refused_in_one_line(tmp_path, edit, message):
    path = tmp_path / "kivi.safetensors"
    save_cache(path, [_kivi(2, 4)])
    _forged(path, edit)
    with pytest.raises(ValueError, match=f"layer 0: {message}") as e:
        load_cache(path)
    assert "\n" not in str(e.value)
