"""load_cache checks every field, not only the digest: nonsense with a recomputed digest is still refused.

Each case edits a real saved cache (a ragged sparse layer, a quantized one, a dense one), recomputes the SHA-256
the way save_cache does and expects a ValueError naming the layer and the field.
"""

import json

import mlx.core as mx
import numpy as np
import pytest

from kvcore import load_cache, quantize_cache, save_cache, select_positions
from kvcore.cache import files as cache_io
from tests.kvcore.conftest import prefill, prompt_ids

SELECTION = [np.array([0, 4, 7]), np.array([1, 2, 3, 9])]


@pytest.fixture
def saved(models, tmp_path):
    """A file with layer 0 sparse (ragged), layer 1 sparse quantized, layers 2-3 dense."""
    model, tok = models["llama"]
    dense = prefill(model, prompt_ids(tok))
    sparse = select_positions(dense, [SELECTION, SELECTION, None, None])
    cache = [sparse[0], quantize_cache([sparse[1]], bits=4, group_size=32)[0], dense[2], dense[3]]
    path = tmp_path / "c.safetensors"
    save_cache(path, cache)
    return path


def _rewrite(path, edit_header=None, edit_arrays=None):
    """Apply the edits and store the file with a digest that matches them (what a forger would do)."""
    header = cache_io._read_header(path)
    arrays = dict(mx.load(str(path), format="safetensors"))
    header.pop("sha256")
    if edit_header:
        edit_header(header["layers"])
    if edit_arrays:
        edit_arrays(arrays)
    header["sha256"] = cache_io._digest(header, arrays)
    mx.save_safetensors(str(path), arrays, {"kvlens": json.dumps(header, sort_keys=True)})


def _set(layer, **fields):
    return lambda layers: layers[layer].update(fields)


CASES = {
    "negative offset": (_set(0, offset=-7), None, "layer 0: offset -7 is negative"),
    "offset not an int": (_set(2, offset="12"), None, "layer 2: offset must be an integer"),
    "offset true": (_set(2, offset=True), None, "layer 2: offset must be an integer"),
    "dense offset past its rows": (_set(2, offset=999), None, "layer 2: offset 999 but"),
    "prefix_counts out of range": (
        _set(0, prefix_counts=[99, -5]),
        None,
        r"layer 0: prefix_counts\[0\] = 99",
    ),
    "prefix_counts wrong length": (
        _set(0, prefix_counts=[3]),
        None,
        "layer 0: prefix_counts must be a list of 2",
    ),
    "kept_counts disagree": (_set(0, kept_counts=[5, 5]), None, "layer 0: kept_counts"),
    "bits 7": (_set(1, bits=7), None, "layer 1: bits=7 is not supported"),
    "group size 48": (_set(1, group_size=48), None, "layer 1: group_size=48 is not supported"),
    "unknown class": (_set(3, **{"class": "os.system"}), None, "layer 3: unknown cache class"),
    "keys dtype int": (
        None,
        lambda a: a.update({"2.keys.0": a["2.keys.0"].astype(mx.int32)}),
        "layer 2: keys",
    ),
    "packed dtype float": (
        None,
        lambda a: a.update({"1.keys.0": a["1.keys.0"].astype(mx.float32)}),
        "layer 1: keys packed dtype",
    ),
    "values rows cut": (None, lambda a: a.update({"3.values.0": a["3.values.0"][:, :, :2]}), "layer 3: keys"),
    "keys 3-d": (
        None,
        lambda a: a.update({"2.keys.0": a["2.keys.0"][0]}),
        "layer 2: keys.0 has 3 dimensions",
    ),
    "position past the prompt": (
        None,
        lambda a: a.update({"0.selection": mx.array([[0, 4, 700, 0], [1, 2, 3, 9]], dtype=mx.int32)}),
        "layer 0: head 0 keeps positions outside",
    ),
    "positions unsorted": (
        None,
        lambda a: a.update({"0.selection": mx.array([[7, 4, 0, 0], [1, 2, 3, 9]], dtype=mx.int32)}),
        "layer 0: head 0 positions are not strictly increasing",
    ),
    "selection float": (
        None,
        lambda a: a.update({"0.selection": a["0.selection"].astype(mx.float32)}),
        "layer 0: selection dtype",
    ),
    "scales swapped with biases' shape": (
        None,
        lambda a: a.update({"1.keys.1": mx.concatenate([a["1.keys.1"]] * 2, axis=-1)}),
        "layer 1: keys scales width",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_nonsense_fields_are_refused_even_with_a_good_digest(saved, case):
    edit_header, edit_arrays, message = CASES[case]
    load_cache(saved)  # the untouched file loads
    _rewrite(saved, edit_header, edit_arrays)
    with pytest.raises(ValueError, match=f"{saved}: {message}"):
        load_cache(saved)


def test_a_rewritten_but_sensible_file_still_loads(saved):
    """The forger's path itself is sound: an edit that keeps every field valid loads (so the cases above fail
    on the field, not on the rewrite)."""
    _rewrite(saved, _set(0, kept_counts=[3, 4]))
    cache, _ = load_cache(saved)
    assert [p.tolist() for p in cache[0].retained_positions] == [s.tolist() for s in SELECTION]
