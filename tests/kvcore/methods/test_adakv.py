"""adakv over several scorers against a brute-force reading of DESIGN.md: safeguard, then best across heads."""

import numpy as np
import pytest

from kvcore.methods import selection
from tests.kvcore.methods.helpers import attention_row, n_kept, observation, random_qk
from tests.kvcore.methods.test_snapkv import snapkv_oracle_scores


def adakv_oracle(priority, n, alpha=0.2):
    """priority [H, T] (inf = always kept). Each head keeps its top floor(alpha n); the rest of H·n goes to the
    highest remaining (head, position) priorities anywhere in the layer."""
    n_heads, n_tokens = priority.shape
    safe = int(np.floor(alpha * n))
    kept = [set(np.argsort(-priority[h], kind="stable")[:safe].tolist()) for h in range(n_heads)]
    candidates = [
        (-priority[h, t], h, t) for h in range(n_heads) for t in range(n_tokens) if t not in kept[h]
    ]
    for _, h, t in sorted(candidates)[: n_heads * n - sum(map(len, kept))]:
        kept[h].add(t)
    return [np.array(sorted(s)) for s in kept]


def knorm_priority(q, k):
    return -np.sqrt((k.astype(np.float64) ** 2).sum(axis=-1))


def h2o_priority(q, k):
    n_q, n_tokens, head_dim = q.shape
    group = n_q // k.shape[0]
    sums = np.array(
        [
            sum(attention_row(q[h, p], k[h // group], p, head_dim**-0.5) for p in range(n_tokens))
            for h in range(n_q)
        ]
    )
    return (sums / (n_tokens - np.arange(n_tokens))).reshape(k.shape[0], group, n_tokens).mean(axis=1)


@pytest.mark.parametrize(("name", "priority"), [("adakv-knorm", knorm_priority), ("adakv-h2o", h2o_priority)])
@pytest.mark.parametrize("shape", [(40, 2, 2, 8), (90, 4, 1, 16), (70, 1, 4, 8)])
def test_adakv_matches_bruteforce(name, priority, shape):
    q, k = random_qk(40, *shape)
    ranking = selection.rank([observation(q, k)], name)
    for ratio in (0.1, 0.3, 0.7, 1.0):
        n = n_kept(shape[0], ratio)
        kept = selection.select(ranking, ratio)[0]
        expected = adakv_oracle(priority(q, k), n)
        assert [len(h) for h in kept] == [len(h) for h in expected]
        for got, want in zip(kept, expected, strict=True):
            np.testing.assert_array_equal(got, want)


def test_adakv_over_snapkv_matches_bruteforce_and_keeps_every_window():
    q, k = random_qk(41, 300, 4, 2, 8)
    priority = np.concatenate([snapkv_oracle_scores(q, k), np.full((4, 64), np.inf)], axis=1)
    ranking = selection.rank([observation(q, k)], "adakv")
    for ratio in (0.25, 0.4, 0.8):
        kept = selection.select(ranking, ratio)[0]
        n = n_kept(300, ratio)
        counts = [len(h) for h in kept]
        assert sum(counts) == 4 * n and min(counts) >= int(0.2 * n) and len(set(counts)) > 1
        for got, want in zip(kept, adakv_oracle(priority, n), strict=True):
            np.testing.assert_array_equal(got, want)
            assert set(range(300 - 64, 300)) <= set(got.tolist())


def test_adakv_flag_wraps_any_per_head_method_and_refuses_shared():
    q, k = random_qk(42, 60, 2, 2, 8)
    ranking = selection.rank([observation(q, k)], "knorm")
    kept = selection.select(ranking, 0.5, adakv=True)[0]
    assert sum(len(h) for h in kept) == 2 * 30
    with pytest.raises(ValueError, match="adakv needs per-head"):
        selection.select(ranking, 0.5, per_head=False, adakv=True)
    with pytest.raises(ValueError, match="adakv needs per-head"):
        selection.select(selection.rank([observation(q, k)], "tova"), 0.5, adakv=True)
