"""The quantization-error view and the statistics rows for the simulated schemes (turboquant, qjl) and kivi: an
error at every kept position and none elsewhere, smaller at more bits; kivi's float residual exact; qjl's values,
packed affine, err as affine's do."""

import numpy as np
import pytest

from kvcore.engine.session import CompressionConfig, Session

PROMPT = "def main(argv):\n    return sum(x * x for x in argv)\n" * 6


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=1)
    return s


def _errors(session: Session, quant: str, bits: int):
    state = session.compress(CompressionConfig("snapkv", 0.5, bits=bits, quant=quant, group_size=32))
    err = state.quant_error
    assert np.array_equal(np.isnan(err), ~state.kept)  # an error at every kept position, none elsewhere
    key = np.mean([r["key_rmse"] for r in state.stats_rows])
    value = np.mean([r["value_rmse"] for r in state.stats_rows])
    return state, float(np.nanmean(err)), key, value


@pytest.mark.parametrize("quant", ["turboquant", "turboquant_prod", "qjl", "kivi:residual=4"])
def test_the_error_shrinks_with_bits(session, quant):
    _, view2, key2, value2 = _errors(session, quant, 2)
    state, view4, key4, value4 = _errors(session, quant, 4)
    assert 0 < view4 < view2 and 0 < key4 < key2 and 0 < value4 < value2
    execution = "genuine" if quant.startswith("kivi") else "simulated"
    assert {r["execution"] for r in state.stats_rows} == {execution}
    assert {r["quant_scheme"] for r in state.stats_rows} == {quant}


def test_turboquant_at_4_bits_errs_less_than_at_2(session):
    _, view2, _, _ = _errors(session, "turboquant", 2)
    _, view4, _, _ = _errors(session, "turboquant", 4)
    assert view4 < 0.5 * view2


def test_kivi_residual_rows_are_exact_and_qjl_values_err_as_affine(session):
    state, _, _, _ = _errors(session, "kivi:residual=4", 2)
    kept_err = state.quant_error[state.kept]
    assert np.any(kept_err == 0) and np.any(kept_err > 0)  # the float residual, the packed body
    for bits in (2, 4):
        _, _, _, qjl_values = _errors(session, "qjl", bits)
        _, _, _, affine_values = _errors(session, "affine", bits)
        assert qjl_values == pytest.approx(affine_values, rel=1e-6)
