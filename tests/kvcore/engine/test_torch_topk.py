"""torch_cpu_topk gives the order torch.topk returns on a CPU, equal scores included (recorded from torch 2.11):
kvpress's DecodingPress stores its kept rows in that order, and snapkv's pooling at the next compression runs
along it."""

import numpy as np
import pytest

from kvcore.engine.torch_topk import torch_cpu_topk

TIES = [4, 3, 3, 4, 2, 3, 4, 1, 0, 1, 1, 4, 4, 0, 2, 4, 0, 3, 0, 2, 4, 1, 1, 1, 3, 1, 4, 2, 2, 2, 2, 2, 2, 4]
TIES += [4, 3, 3, 3, 1, 4]

CASES = [
    # snapkv's observation window: 8 rows padded to one score; torch leaves them as 7, 13, 12, …, 8, 6
    ([0.3, 0.1, 0.7, 0.2, 0.5, 0.4] + [2.0] * 8, 10, [7, 13, 12, 11, 10, 9, 8, 6, 2, 4]),
    (
        TIES,
        30,
        [39, 34, 33, 26, 0, 15, 12, 11, 3, 6, 20, 2, 17, 5, 35, 36, 37, 1, 24, 19, 14, 32, 31, 30, 29, 28, 27]
        + [4, 7, 25],
    ),
    (
        [(i * 11) % 7 // 3 for i in range(50)],
        37,
        [19, 33, 26, 5, 47, 12, 40, 24, 36, 20, 41, 22, 15, 31, 27, 38, 29, 17, 43, 13, 45, 10, 34, 8, 6, 48]
        + [3, 1, 14, 49, 37, 39, 42, 44, 46, 0, 11],
    ),
    ([(i * 7) % 5 // 2 for i in range(200)], 3, [12, 7, 2]),  # k · 64 <= n: torch's partial_sort path
]


@pytest.mark.parametrize(("scores", "k", "expected"), CASES)
def test_order_is_torch_cpu_topk_with_ties(scores, k, expected):
    assert torch_cpu_topk(np.array(scores, np.float32), k).tolist() == expected


def test_distinct_scores_come_out_largest_first():
    scores = np.random.default_rng(0).permutation(300).astype(np.float32)
    assert torch_cpu_topk(scores, 250).tolist() == np.argsort(-scores)[:250].tolist()


def test_k_beyond_the_scores_is_one_line():
    with pytest.raises(ValueError, match="between 0 and 3"):
        torch_cpu_topk([1.0, 2.0, 3.0], 4)
