"""Metrics against hand-computed values."""

import math

import numpy as np
import pytest

from kvcore.measure import metrics
from kvcore.measure.metrics import (
    attention_mass_kept,
    first_divergence,
    kept_jaccard,
    log_softmax,
    per_step,
    pooled_rmse,
    teacher_forced,
)


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


def test_attention_mass_kept():
    attn = np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]])
    mass = attention_mass_kept(attn, [np.array([0, 2, 7]), np.array([2])])
    np.testing.assert_allclose(mass, [0.75, 0.8])


def test_pooled_rmse_equals_the_rmse_over_the_valid_rows():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(3, 6, 8)), rng.normal(size=(3, 6, 8))
    valid = np.array([[True] * 6, [True, False, True, True, False, False], [False] * 6])
    rows = np.sqrt(((a - b) ** 2).mean(axis=-1))
    rows[~valid] = 99.0  # padding rows carry garbage; it must not count
    direct = [np.sqrt(((a[h, valid[h]] - b[h, valid[h]]) ** 2).mean()) for h in range(2)]
    np.testing.assert_allclose(pooled_rmse(rows, valid), [*direct, 0.0])


def _brute_top_k(logits, k=5):
    x = logits.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = np.array([sorted(range(x.shape[-1]), key=lambda i, r=r: (-p[r, i], i))[:k] for r in range(len(x))])
    return ids, np.take_along_axis(p, ids, axis=-1)


def test_per_step_top_k_is_the_softmax_top_k_by_brute_force():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 50)).astype(np.float32)
    logits[2, [3, 7, 11]] = 9.0  # a three-way tie at the top: lower ids first
    targets = logits.argmax(-1)
    steps = per_step(logits, logits.copy(), targets)
    ids, probs = steps.dense_top_ids, steps.dense_top_probs
    np.testing.assert_array_equal(steps.compressed_top_ids, ids)
    expected_ids, expected_probs = _brute_top_k(logits)
    assert ids.tolist() == expected_ids.tolist()
    np.testing.assert_allclose(probs, expected_probs, rtol=1e-12)
    assert ids[2, :3].tolist() == [3, 7, 11]
    assert per_step(logits[:, :3], logits[:, :3], targets % 3).dense_top_ids.shape == (4, 3)


def test_per_step_equals_teacher_forced_one_step_at_a_time():
    rng = np.random.default_rng(2)
    dense, comp = rng.normal(size=(2, 6, 30))
    targets = dense.argmax(-1)
    comp[1] = dense[1]  # one step with equal distributions
    steps = per_step(dense, comp, targets)
    for i in range(6):
        one = teacher_forced(dense[i : i + 1], comp[i : i + 1], targets[i : i + 1])
        assert steps.kl[i] == pytest.approx(one["kl_mean"], rel=1e-12, abs=1e-15)
        assert bool(steps.agreement[i]) == (one["agreement"] == 1.0)
        np.testing.assert_array_equal(steps.dense_top_ids[i], _brute_top_k(dense[i : i + 1])[0][0])
        np.testing.assert_array_equal(steps.compressed_top_ids[i], _brute_top_k(comp[i : i + 1])[0][0])
    assert steps.kl[1] == 0.0 and steps.agreement[1]
    assert steps.dense_top_probs.shape == (6, 5)
    with pytest.raises(ValueError, match="shapes differ"):
        per_step(dense, comp[:3], targets)


def test_kept_jaccard_per_layer_against_sets():
    rng = np.random.default_rng(3)
    a, b = rng.random((2, 3, 2, 40)) < 0.4
    b[2] = a[2]
    a[1] = b[1] = False  # both keep nothing: the same (empty) set
    got = kept_jaccard(a, b)
    for layer in range(3):
        sa = {(h, t) for h, t in zip(*np.nonzero(a[layer]), strict=True)}
        sb = {(h, t) for h, t in zip(*np.nonzero(b[layer]), strict=True)}
        expected = len(sa & sb) / len(sa | sb) if sa | sb else 1.0
        assert got[layer] == pytest.approx(expected)
    assert got[2] == 1.0 and 0.0 < got[0] < 1.0
    with pytest.raises(ValueError, match="shape"):
        kept_jaccard(a, b[:, :, :3])


def test_compare_equals_teacher_forced_and_per_step():
    """Session's one-pass comparison (dense side kept per prefill) gives exactly the two metrics computed apart."""
    rng = np.random.default_rng(3)
    dense, comp = rng.normal(size=(2, 9, 300)) * 4
    targets = rng.integers(0, 300, 9)
    ref = metrics.reference(dense)
    for skip in (0, 1, 9):
        for n in (9, 5):
            summary, steps = metrics.compare(ref, comp[:n], targets[:n], min(skip, n))
            s = min(skip, n)
            np.testing.assert_equal(summary, metrics.teacher_forced(dense[s:n], comp[s:n], targets[s:n]))
            alone = metrics.per_step(dense[:n], comp[:n], targets[:n])
            for field in ("kl", "agreement", "dense_top_ids", "dense_top_probs", "compressed_top_ids"):
                assert np.array_equal(getattr(steps, field), getattr(alone, field)), field
    with pytest.raises(ValueError, match="shapes differ"):
        metrics.compare(ref, comp[:, :10], targets, 0)


def test_compare_in_blocks_equals_the_whole_array_definitions(monkeypatch):
    """A long continuation is compared COMPARE_BLOCK rows at a time: every number stays that of the definitions
    applied to whole arrays (here blocks of 4 rows over 11 steps, the last block short)."""
    rng = np.random.default_rng(5)
    dense, comp = rng.normal(size=(2, 11, 200)) * 4
    targets = rng.integers(0, 200, 11)
    monkeypatch.setattr(metrics, "COMPARE_BLOCK", 4)
    ref = metrics.reference(dense)
    assert ref.top_ids.shape == (11, metrics.TOP_K)
    np.testing.assert_array_equal(ref.lp(0, 11), metrics.log_softmax(dense))
    for skip in (0, 1, 6):
        summary, steps = metrics.compare(ref, comp, targets, skip)
        np.testing.assert_equal(summary, metrics.teacher_forced(dense[skip:], comp[skip:], targets[skip:]))
        monkeypatch.setattr(metrics, "COMPARE_BLOCK", 1 << 20)
        whole = metrics.per_step(dense, comp, targets)
        monkeypatch.setattr(metrics, "COMPARE_BLOCK", 4)
        for field in ("kl", "agreement", "dense_top_ids", "dense_top_probs", "compressed_top_ids"):
            assert np.array_equal(getattr(steps, field), getattr(whole, field)), field
