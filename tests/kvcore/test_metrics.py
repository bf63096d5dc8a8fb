"""Metrics against hand-computed values."""

import math

import numpy as np
import pytest

from kvcore.metrics import attention_mass_kept, first_divergence, log_softmax, rmse_per_head, teacher_forced


def test_identical_logits_give_zero_kl_full_agreement():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 11))
    targets = logits.argmax(-1)
    m = teacher_forced(logits, logits.copy(), targets)
    assert m["agreement"] == 1.0
    assert m["kl_mean"] == 0.0 and m["kl_max"] == 0.0
    assert m["nll_delta"] == 0.0


def test_kl_and_nll_match_closed_form():
    p = np.array([[0.75, 0.25]])
    q = np.array([[0.5, 0.5]])
    m = teacher_forced(np.log(p), np.log(q), np.array([0]))
    assert m["kl_mean"] == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    assert m["nll_delta"] == pytest.approx(-math.log(0.5) + math.log(0.75))
    assert m["agreement"] == 1.0  # argmax of q is index 0 on a tie


def test_agreement_counts_mismatches():
    dense = np.array([[5.0, 0.0], [5.0, 0.0], [0.0, 5.0]])
    comp = np.array([[5.0, 0.0], [0.0, 5.0], [0.0, 5.0]])
    assert teacher_forced(dense, comp, np.array([0, 0, 1]))["agreement"] == pytest.approx(2 / 3)


def test_shape_mismatch_is_explained():
    with pytest.raises(ValueError, match="shapes differ"):
        teacher_forced(np.zeros((2, 3)), np.zeros((3, 3)), np.array([0, 1]))


def test_log_softmax_normalises():
    x = np.array([[1000.0, 1000.0, 0.0]])
    assert np.exp(log_softmax(x)).sum() == pytest.approx(1.0)


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([4], [5]) == 0


def test_attention_mass_and_rmse():
    attn = np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]])
    mass = attention_mass_kept(attn, [np.array([0, 2, 7]), np.array([2])])
    np.testing.assert_allclose(mass, [0.75, 0.8])
    a = np.zeros((2, 4, 3))
    b = a.copy()
    b[1] += 2.0
    np.testing.assert_allclose(rmse_per_head(a, b), [0.0, 2.0])
