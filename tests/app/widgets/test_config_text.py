"""config_label names a quantization scheme other than affine where something is packed."""

from app.widgets.config_text import config_label


def test_the_label_names_a_scheme_other_than_affine():
    base = {"method": "snapkv", "ratio": 0.25, "bits": 4, "group_size": 32}
    assert config_label(base) == "snapkv 25 % · 4-bit g32"
    assert config_label({**base, "quant": "affine"}) == "snapkv 25 % · 4-bit g32"
    assert config_label({**base, "quant": "mxfp4"}) == "snapkv 25 % · 4-bit mxfp4 g32"
    assert config_label({**base, "quant": "mxfp4", "bits": None}) == "snapkv 25 % · 16-bit"
