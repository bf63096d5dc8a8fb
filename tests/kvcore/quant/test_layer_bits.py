"""Layer-adaptive widths: a width per layer, or the first and last k layers at higher bits, for every scheme and
with separate key/value widths; the stored bytes follow each layer's width, and the CLI and the stats CSV say it."""

import csv
import json

import pytest

from kvcore import cache_tensor_bytes, quantize_cache
from kvcore.cli.main import main
from kvcore.engine.session import CompressionConfig, _by_width
from tests.kvcore.conftest import prefill, prompt_ids


def test_layer_widths_resolve_edges_lists_and_float_sides():
    edges = CompressionConfig(bits=4, edge_layers=1, edge_bits=8)
    assert edges.layer_widths(4) == [(8, 8), (4, 4), (4, 4), (8, 8)]
    split = CompressionConfig(bits=8, value_bits=4, layer_bits=(2, 3, 4))
    assert split.layer_widths(3) == [(2, 2), (3, 3), (4, 4)]
    float_keys = CompressionConfig(bits=None, value_bits=4, edge_layers=1, edge_bits=8)
    assert float_keys.layer_widths(3) == [(16, 8), (16, 4), (16, 8)]
    assert CompressionConfig(bits=None, edge_layers=2).layer_widths(2) == [(16, 16)] * 2  # nothing packed
    assert (
        CompressionConfig(bits=4, quant="mxfp4").layer_widths(2) == [(4, 4)] * 2
    )  # edge_bits unused: no refusal


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"bits": 4, "quant": "mxfp4", "edge_layers": 1}, r"mxfp4: layer widths must be in \(4,\), got 8"),
        ({"bits": 4, "layer_bits": (4, 7)}, r"layer widths must be in \(2, 3, 4, 5, 6, 8\), got 7"),
        (
            {"bits": 4, "layer_bits": (4, 8), "edge_layers": 1},
            "give layer_bits .* or edge_layers .*, not both",
        ),
        ({"bits": 4, "edge_layers": -1}, "edge_layers must be a whole number of layers >= 0"),
    ],
)
def test_bad_layer_widths_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig(**kwargs)


def test_a_list_of_the_wrong_length_names_the_layer_count():
    with pytest.raises(
        ValueError, match="layer_bits gives 2 widths, the model has 4 layers: give one per layer"
    ):
        CompressionConfig(bits=4, layer_bits=(4, 8)).layer_widths(4)


@pytest.mark.parametrize(
    "quant, edge, inner", [("affine", 8, 2), ("rotated", 8, 4), ("kivi:residual=4", 8, 2)]
)
def test_cli_edge_layers_store_their_own_widths_and_say_so(
    model_dirs, prompt_file, tmp_path, capsys, quant, edge, inner
):
    base = [
        "compress",
        "--model",
        str(model_dirs["llama"]),
        "--prompt-file",
        str(prompt_file),
        "--tokens",
        "2",
    ]
    flags = ["--quant", quant, "--bits", str(inner), "--group-size", "32", "--ratio", "1", "--json"]
    totals = {}
    for extra in ([], ["--edge-layers", "1", "--edge-bits", str(edge)]):
        path = tmp_path / f"{len(extra)}.csv"
        assert main([*base, *flags, *extra, "--csv", str(path)]) == 0
        summary = json.loads(capsys.readouterr().out)
        totals[len(extra)] = summary["bytes_compressed_total"]
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    n_layers = 1 + max(int(r["layer"]) for r in rows)
    by_layer = {int(r["layer"]): r["bits_per_layer"] for r in rows}
    assert by_layer[0] == by_layer[n_layers - 1] == f"{edge}/{edge}"
    assert all(by_layer[i] == f"{inner}/{inner}" for i in range(1, n_layers - 1))
    assert summary["bits_per_layer"] == f"edges 1 at {edge}"
    assert totals[4] > totals[0]  # wider edge layers store more


def test_bytes_follow_each_layers_width(models):
    model, tok = models["llama"]
    ids = prompt_ids(tok)
    widths = [(8, 4)] + [(4, 4)] * (len(model.layers) - 1)
    mixed = _by_width(prefill(model, ids), widths, lambda c, **w: quantize_cache(c, group_size=32, **w))
    assert [(c.bits, c.value_bits) for c in mixed] == widths
    first = quantize_cache(prefill(model, ids)[:1], bits=8, value_bits=4, group_size=32)
    rest = quantize_cache(prefill(model, ids)[1:], bits=4, group_size=32)
    assert cache_tensor_bytes(mixed) == cache_tensor_bytes(first) + cache_tensor_bytes(rest)
