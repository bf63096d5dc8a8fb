"""save_cache / load_cache: every class round-trips and decodes identically; damaged files are refused clearly."""

import json
import os
import struct

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

from kvcore import copy_cache, load_cache, quantize_cache, save_cache, select_positions, to_sparse_all
from tests.kvcore.conftest import prefill, prompt_ids, run

RAGGED = [[np.array([0, 4, 7]), np.arange(10)], None, np.array([[1, 2], [3, 9]])]


def _variants(model, ids):
    dense = prefill(model, ids)
    ragged = select_positions(dense, RAGGED)
    run(model, ragged, [3, 4])  # appended rows and grown buffers must survive too
    return {
        "KVCache": dense,
        "QuantizedKVCache": [c.to_quantized(group_size=64, bits=4) for c in copy_cache(dense)],
        "SparseKVCache (B0)": to_sparse_all(dense),
        "SparseKVCache (ragged)": ragged,
        "SparseQuantizedKVCache": quantize_cache(ragged, bits=8, group_size=64),
    }


@pytest.mark.parametrize(
    "variant",
    ["KVCache", "QuantizedKVCache", "SparseKVCache (B0)", "SparseKVCache (ragged)", "SparseQuantizedKVCache"],
)
def test_round_trip_decodes_identically(models, tmp_path, variant):
    model, tok = models["qwen3"]
    cache = _variants(model, prompt_ids(tok))[variant]
    path = tmp_path / "cache.safetensors"
    save_cache(path, cache, {"prompt": "fox", "ratio": 0.5})
    loaded, meta = load_cache(path)
    assert meta == {"prompt": "fox", "ratio": 0.5}
    assert [type(c) for c in loaded] == [type(c) for c in cache]
    for a, b in zip(cache, loaded, strict=True):
        assert a.offset == b.offset
        if hasattr(a, "retained_positions"):
            assert [p.tolist() for p in a.retained_positions] == [p.tolist() for p in b.retained_positions]
            assert a.kept_counts.tolist() == b.kept_counts.tolist()
    original = copy_cache(cache)
    for tokens in ([5, 6], [7]):
        np.testing.assert_array_equal(run(model, loaded, tokens), run(model, original, tokens))
    assert os.listdir(tmp_path) == ["cache.safetensors"]  # the temp file was renamed, none left behind


def test_file_is_plain_safetensors_with_json_metadata(models, tmp_path):
    model, tok = models["llama"]
    path = tmp_path / "c.kv"
    save_cache(path, select_positions(prefill(model, prompt_ids(tok)), [np.arange(3)] * 4))
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = json.loads(header["__metadata__"]["kvlens"])
    assert meta["format"] == "kvlens-cache" and meta["version"] == 1 and len(meta["sha256"]) == 64
    assert meta["layers"][0]["class"] == "SparseKVCache" and meta["layers"][0]["kept_counts"] == [3, 3]
    assert "0.selection" in header and "0.keys.0" in header
    save_cache(path, [KVCache()])  # overwriting is atomic too
    assert load_cache(path)[0][0].keys is None


def _saved(models, tmp_path):
    model, tok = models["llama"]
    path = tmp_path / "c.safetensors"
    save_cache(path, select_positions(prefill(model, prompt_ids(tok)), [np.arange(3), None, None, None]))
    return path


def test_tampered_array_bytes_are_detected(models, tmp_path):
    path = _saved(models, tmp_path)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=f"{path}: SHA-256 digest mismatch"):
        load_cache(path)


def test_tampered_metadata_is_detected(models, tmp_path):
    path = _saved(models, tmp_path)
    raw = path.read_bytes()
    start = raw.index(b'offset\\": ') + len(b'offset\\": ')  # the first layer's offset, inside the JSON
    digit = raw[start : start + 1]
    tampered = raw[:start] + (b"1" if digit != b"1" else b"2") + raw[start + 1 :]
    assert tampered != raw
    path.write_bytes(tampered)
    with pytest.raises(ValueError, match="digest mismatch"):
        load_cache(path)


@pytest.mark.parametrize("keep", [0, 5, 100, -1])
def test_truncated_files_are_refused(models, tmp_path, keep):
    path = _saved(models, tmp_path)
    raw = path.read_bytes()
    path.write_bytes(raw[:keep] if keep >= 0 else raw[:-1])
    with pytest.raises(ValueError, match=f"{path}: truncated"):
        load_cache(path)


def test_wrong_format_files_are_refused(tmp_path):
    other = tmp_path / "weights.safetensors"
    mx.save_safetensors(str(other), {"w": mx.zeros((2,))})
    with pytest.raises(ValueError, match="not a KV Lens cache file"):
        load_cache(other)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{]")
    with pytest.raises(ValueError, match="not a safetensors file"):
        load_cache(junk)
    with pytest.raises(ValueError, match="no such file"):
        load_cache(tmp_path / "missing.safetensors")


def test_unsupported_layers_and_metadata_are_refused(tmp_path):
    x = mx.zeros((1, 2, 3, 32))
    rotating = RotatingKVCache(max_size=8)
    rotating.update_and_fetch(x, x)
    with pytest.raises(ValueError, match="layer 1 is a RotatingKVCache; only"):
        save_cache(tmp_path / "r.safetensors", [KVCache(), rotating])
    with pytest.raises(ValueError, match="metadata must be JSON-serializable"):
        save_cache(tmp_path / "m.safetensors", [KVCache()], {"x": object()})
    assert os.listdir(tmp_path) == []
    q = QuantizedKVCache(group_size=32, bits=4)
    q.update_and_fetch(x, x)
    save_cache(tmp_path / "q.safetensors", [q])
    assert type(load_cache(tmp_path / "q.safetensors")[0][0]) is QuantizedKVCache
