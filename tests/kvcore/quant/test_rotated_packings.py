"""rotated over every packing (affine, mxfp4, nvfp4, mxfp8): the packing declared as a named integer choice, carried
in the scheme's spec through caches and files, and attention on the packed form equal to dequantize-then-attend."""

import mlx.core as mx
import numpy as np
import pytest

from kvcore import quantize_cache
from kvcore.cache import files as cache_io
from kvcore.model.attention import split_quantized_sdpa
from kvcore.quant import get
from kvcore.quant.rotated import rotation_matrix
from tests.kvcore.conftest import prefill, prompt_ids, run

PACKINGS = [("affine", 4, 3), ("mxfp4", 4, 2), ("nvfp4", 4, 2), ("mxfp8", 8, 2)]


@pytest.mark.parametrize("packing, bits, parts", PACKINGS)
def test_pack_is_the_inner_format_of_the_rotated_rows(packing, bits, parts):
    scheme = get(f"rotated:packing={packing},seed=2")
    assert (scheme.mode, scheme.n_parts) == (packing, parts)
    assert scheme.spec == ("rotated:seed=2" if packing == "affine" else f"rotated:seed=2,packing={packing}")
    x = np.random.default_rng(0).normal(size=(1, 2, 8, 64)).astype(np.float32)
    r = np.array(rotation_matrix(64, 2), dtype=np.float64)
    packed = scheme.pack(mx.array(x), bits)
    np.testing.assert_allclose(np.array(scheme.rotate(mx.array(x))), x @ r, atol=1e-5)
    want = mx.quantize(scheme.rotate(mx.array(x)), group_size=scheme.group_size, bits=bits, mode=packing)
    for a, b in zip(packed, want, strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    inner = mx.dequantize(*want, group_size=scheme.group_size, bits=bits, mode=packing)
    inner = np.array(inner.astype(mx.float32), dtype=np.float64)
    np.testing.assert_allclose(
        np.array(scheme.unpack(packed, bits), dtype=np.float64), inner @ r.T, atol=1e-5
    )


@pytest.mark.parametrize("packing, bits, _", PACKINGS)
def test_genuine_attention_equals_dequantize_then_attend(packing, bits, _):
    rng = np.random.default_rng(3)
    q, k, v = (mx.array(rng.normal(size=(1, 4, n, 64)).astype(np.float32)) for n in (3, 48, 48))
    scheme = get("rotated", packing=("affine", "mxfp4", "nvfp4", "mxfp8").index(packing), seed=1)
    kp, vp = scheme.pack(k[:, ::2], bits), scheme.pack(v[:, ::2], bits)  # GQA: 2 kv-heads, 4 query heads
    got = split_quantized_sdpa(q, kp, vp, 0.125, "causal", scheme.group_size, bits, bits, scheme.mode, scheme)
    kd, vd = (scheme.unpack(p, bits).astype(mx.float32) for p in (kp, vp))
    want = mx.fast.scaled_dot_product_attention(q, kd, vd, scale=0.125, mask="causal")
    np.testing.assert_allclose(np.array(got), np.array(want), atol=2e-2 if bits == 4 else 5e-3)


def test_the_packing_reaches_the_cache_its_file_and_the_model(models, tmp_path):
    model, tok = models["llama"]
    ids = prompt_ids(tok)
    packed = quantize_cache(prefill(model, ids), bits=4, group_size=64, quant="rotated:packing=nvfp4")
    assert all((c.quant, c.mode, c.group_size) == ("rotated:packing=nvfp4", "nvfp4", 16) for c in packed)
    path = tmp_path / "cache.safetensors"
    cache_io.save_cache(path, packed)
    loaded, _ = cache_io.load_cache(path)
    assert all(c.quant == "rotated:packing=nvfp4" for c in loaded)
    np.testing.assert_array_equal(run(model, loaded, [5]), run(model, packed, [5]))


def test_a_packing_by_name_or_code_and_a_bad_one_in_one_line():
    assert get("rotated:packing=mxfp8") == get("rotated", packing=3) == get("rotated:packing=3")
    assert get("rotated").spec == "rotated"
    with pytest.raises(ValueError, match=r"packing must be one of affine, mxfp4, nvfp4, mxfp8, got 'int4'"):
        get("rotated:packing=int4")
    with pytest.raises(ValueError, match=r"takes packing in 0 affine, 1 mxfp4, 2 nvfp4, 3 mxfp8, got 7"):
        get("rotated", packing=7)
    with pytest.raises(
        ValueError, match=r"bits=8 is not supported: rotated with packing mxfp4 allows bits in \(4,\)"
    ):
        get("rotated:packing=mxfp4").check(8, 64)


def test_cli_quant_spec_reaches_the_json(model_dirs, prompt_file, capsys):
    import json

    from kvcore.cli.main import main

    base = ["--model", str(model_dirs["llama"]), "--prompt-file", str(prompt_file), "--tokens", "2"]
    assert main(["compress", *base, "--quant", "rotated:packing=mxfp4", "--bits", "4", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["quant_scheme"], summary["execution"]) == ("rotated:packing=mxfp4", "genuine")


def test_cli_param_sets_the_scheme_parameter(model_dirs, prompt_file, capsys):
    import json

    from kvcore.cli.main import main

    base = ["--model", str(model_dirs["llama"]), "--prompt-file", str(prompt_file), "--tokens", "2"]
    assert (
        main(["compress", *base, "--quant", "rotated", "--param", "packing=2", "--bits", "4", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["quant_scheme"] == "rotated:packing=nvfp4"
    assert main(["compress", *base, "--quant", "affine", "--param", "packing=2", "--bits", "4"]) == 2
    assert "--param packing: snapkv has no such parameter" in capsys.readouterr().err
