"""config_label names a quantization scheme other than affine where something is packed, and the dense
cache's element type where a side is not packed (when the model's is known)."""

from app.widgets.config_text import config_label


def test_the_label_names_a_scheme_other_than_affine():
    base = {"method": "snapkv", "ratio": 0.25, "bits": 4, "group_size": 32}
    assert config_label(base) == "snapkv 25 % · 4-bit g32"
    assert config_label({**base, "quant": "affine"}) == "snapkv 25 % · 4-bit g32"
    assert config_label({**base, "quant": "mxfp4"}) == "snapkv 25 % · 4-bit mxfp4 g32"
    assert config_label({**base, "quant": "mxfp4", "bits": None}) == "snapkv 25 % · 16-bit"


def test_without_a_baseline_the_label_says_16_bit_as_before():
    base = {"method": "snapkv", "ratio": 0.25, "bits": 8, "value_bits": 16, "group_size": 64}
    assert config_label({**base, "bits": 16}) == "snapkv 25 % · 16-bit"
    assert config_label(base) == "snapkv 25 % · K8/V16-bit g64"
    assert config_label({**base, "bits": 16, "value_bits": 4}) == "snapkv 25 % · K16/V4-bit g64"
    assert config_label({**base, "value_bits": 4, "quant": "mxfp4"}) == "snapkv 25 % · K8/V4-bit mxfp4 g64"


def test_a_baseline_names_the_unquantized_side():
    base = {"method": "snapkv", "ratio": 0.25, "bits": 8, "value_bits": 16, "group_size": 64}
    assert config_label({**base, "bits": None, "value_bits": None}, "float32") == "snapkv 25 % · float32"
    assert config_label({**base, "bits": 16}, "bfloat16") == "snapkv 25 % · bfloat16"
    assert config_label(base, "float32") == "snapkv 25 % · K8/V float32 g64"
    assert (
        config_label({**base, "bits": 16, "value_bits": 4}, "float32") == "snapkv 25 % · K float32/V4-bit g64"
    )
    assert config_label({**base, "value_bits": 8}, "float32") == "snapkv 25 % · 8-bit g64"
    assert config_label({**base, "value_bits": 4}, "float32") == "snapkv 25 % · K8/V4-bit g64"
    assert (
        config_label({**base, "bits": 16, "per_head": False}, "float32") == "snapkv 25 % · float32 · shared"
    )


def test_layer_widths_and_a_schemes_parameters_are_named():
    base = {"method": "snapkv", "ratio": 0.25, "bits": 4, "group_size": 32, "quant": "rotated:packing=mxfp4"}
    assert config_label(base) == "snapkv 25 % · 4-bit rotated:packing=mxfp4 g32"
    assert config_label({**base, "edge_layers": 2, "edge_bits": 8}).endswith("g32 edges 2@8")
    assert config_label({**base, "layer_bits": [8, 4, 4, 8]}).endswith("g32 layers 8,4,4,8")
