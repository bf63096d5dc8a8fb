"""Full-precision residual (--fp-recent R): the kept sinks and the last R prompt positions stored float beside the
packed rest, both stores attended to as one key set, zero quantization error where the residual is."""

import csv

import numpy as np
import pytest

from kvcore import quantize_cache
from kvcore.cache.residual import ResidualKVCache, split_select
from kvcore.cli.main import main
from kvcore.engine.session import CompressionConfig, Session
from tests.kvcore.conftest import GROUP, prefill, prompt_ids, reference_attention, run

PROMPT = (
    "def area(width, height):\n    return width * height\nThe quick brown fox jumps over the lazy dog. " * 3
)
N_SINK, R = 4, 5


def _ragged_selection(T: int, n_heads: int, seed: int) -> list[np.ndarray]:
    """Head 0 keeps no residual position (body only), head 1 only residual ones, the others a random mix."""
    rng = np.random.default_rng(seed)
    residual = np.r_[0:N_SINK, T - R : T]
    heads = [np.arange(N_SINK + 2, T - R - 1, 2), residual[::2]]
    for _ in range(n_heads - 2):
        heads.append(np.sort(rng.choice(T, size=T // 2, replace=False)))
    assert n_heads >= 2
    return heads


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("widths", [(4, 4), (8, 4)])
def test_decode_equals_float64_attention_over_the_dequantized_body_and_the_float_residual(
    models, arch, widths
):
    model, tok = models[arch]
    ids, group = prompt_ids(tok), GROUP[arch]
    T, (kb, vb) = len(ids), widths
    fp = prefill(model, ids)
    n_heads = fp[0].keys.shape[1]
    kept = [_ragged_selection(T, n_heads, seed) for seed in range(len(fp))]
    packed = quantize_cache(prefill(model, ids), bits=kb, group_size=group, value_bits=vb)
    cache = split_select(fp, packed, kept, T, N_SINK, R)
    assert all(isinstance(c, ResidualKVCache) for c in cache)
    got = np.concatenate([run(model, cache, [5, 6, 7]), run(model, cache, [8])])  # several tokens, then one
    assert all(c.residual.n_appended == 4 and c.body.n_appended == 0 for c in cache)  # new tokens stay float
    dense = prefill(model, ids)
    in_residual = np.r_[0:N_SINK, T - R : T]
    with reference_attention(model, dense, kept, T, quant=(kb, group, vb), float_positions=in_residual):
        want = np.concatenate([run(model, dense, [5, 6, 7]), run(model, dense, [8])])
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)
    dense = prefill(model, ids)  # the residual matters: every row packed gives another output
    with reference_attention(model, dense, kept, T, quant=(kb, group, vb)):
        all_packed = run(model, dense, [5, 6, 7])
    assert np.abs(all_packed - want[:3]).max() > 1e-2


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=6)
    return s


@pytest.mark.parametrize("per_head", [True, False])
def test_residual_rows_are_exact_and_the_rest_equals_the_packed_path(session, per_head):
    group, fp_recent = GROUP["llama"], 16
    cfg = CompressionConfig("h2o", 0.5, bits=4, group_size=group, per_head=per_head, fp_recent=fp_recent)
    state = session.compress(cfg)
    packed = session.compress(CompressionConfig.from_dict({**cfg.to_dict(), "fp_recent": 0}))
    assert np.array_equal(state.kept, packed.kept)
    T = state.kept.shape[2]
    in_residual = (np.arange(T) < cfg.n_sink) | (np.arange(T) >= T - fp_recent)
    res = state.kept & in_residual
    body = state.kept & ~in_residual
    assert res.any() and body.any()
    assert np.all(state.quant_error[res] == 0.0)  # the heatmap's quantization-error view: zero there
    assert np.all(packed.quant_error[res] > 0.0)
    np.testing.assert_array_equal(state.quant_error[body], packed.quant_error[body])
    assert np.all(np.isnan(state.quant_error[~state.kept]))
    dense = session._observed(cfg.schedule).cache
    expected_bytes = 0
    for layer, (d, c) in enumerate(zip(dense, state.cache, strict=True)):
        assert isinstance(c, ResidualKVCache)
        k, v = c.residual.keys_and_values()
        for h, positions in enumerate(c.residual.retained_positions):
            assert set(positions.tolist()) == set(np.flatnonzero(res[layer, h]).tolist())
            n = len(positions)
            for stored, full in ((k, d.keys), (v, d.values)):  # K and V: exactly the dense rows
                assert np.array_equal(np.array(stored[0, h, :n]), np.array(full)[0, h, positions])
        assert [set(p.tolist()) for p in c.body.retained_positions] == [
            set(np.flatnonzero(body[layer, h]).tolist()) for h in range(state.kept.shape[1])
        ]
        expected_bytes += k.nbytes + v.nbytes
        expected_bytes += sum(a.nbytes for side in c.body.keys_and_values() for a in side)
    assert state.bytes_compressed == expected_bytes  # the sum of both stores' arrays
    assert (
        packed.bytes_compressed
        < state.bytes_compressed
        < session.compress(CompressionConfig("h2o", 0.5)).bytes_compressed
    )
    for new, old in zip(state.stats_rows, packed.stats_rows, strict=True):
        assert new["fp_recent"] == fp_recent and old["fp_recent"] == 0
        assert new["key_rmse"] < old["key_rmse"] and new["value_rmse"] < old["value_rmse"]
    regen = session.regenerate(state)
    assert len(regen.tokens) == 6 and regen.metrics["kl_mean"] >= 0.0
    assert all(c.residual.n_appended == 0 for c in state.cache)  # regeneration decodes on a branch


def test_fp_recent_is_validated_and_dropped_when_nothing_is_packed():
    assert CompressionConfig("snapkv", 0.5, fp_recent=64).fp_recent == 0
    assert CompressionConfig("snapkv", 0.5, bits=4, fp_recent=64).fp_recent == 64
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="fp_recent"):
            CompressionConfig("snapkv", 0.5, bits=4, fp_recent=bad)


@pytest.fixture
def prompt_file(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text(PROMPT)
    return p


@pytest.mark.parametrize("value", ["-1", "2.5", "many"])
def test_cli_bad_fp_recent_exits_2_with_one_line(model_dirs, prompt_file, capsys, value):
    argv = ["compress", "--model", str(model_dirs["llama"]), "--prompt-file", str(prompt_file), "--bits", "4"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, f"--fp-recent={value}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--fp-recent" in err and value in err


def test_cli_fp_recent_reaches_the_csv_and_help(model_dirs, prompt_file, tmp_path, capsys):
    out = tmp_path / "s.csv"
    flags = f"--prompt-file {prompt_file} --group-size 32 --tokens 3 --bits 4 --fp-recent 8 --csv {out}"
    assert main(["compress", "--model", str(model_dirs["llama"]), *flags.split()]) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["fp_recent"] for r in rows} == {"8"} and all(float(r["key_rmse"]) > 0 for r in rows)
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "--fp-recent" in capsys.readouterr().out
