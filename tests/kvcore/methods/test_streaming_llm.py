"""streaming_llm and full against DESIGN.md."""

import numpy as np
import pytest

from tests.kvcore.methods.helpers import RATIOS, SHAPES, kvcore_kept, n_kept, observation, random_qk


@pytest.mark.parametrize("shape", SHAPES)
def test_streaming_llm_keeps_sinks_and_recent(shape):
    n_tokens = shape[0]
    obs = observation(*random_qk(11, *shape))
    for ratio in RATIOS:
        n = n_kept(n_tokens, ratio)
        sinks = list(range(min(4, n)))
        recent = list(range(n_tokens - max(n - 4, 0), n_tokens))
        np.testing.assert_array_equal(kvcore_kept(obs, "streaming_llm", ratio), sorted(set(sinks + recent)))


def test_streaming_llm_sink_count():
    obs = observation(*random_qk(12, 50, 1, 1, 8))
    # kvpress keeps int(50 · (1 − 0.8)) = int(9.999999999999998) = 9: the 2 sinks and the last 7.
    np.testing.assert_array_equal(kvcore_kept(obs, "streaming_llm", 0.2, n_sink=2), [0, 1, *range(43, 50)])


@pytest.mark.parametrize("ratio", [0.01, 0.5, 1.0])
def test_full_keeps_everything(ratio):
    obs = observation(*random_qk(13, 30, 2, 2, 8))
    np.testing.assert_array_equal(kvcore_kept(obs, "full", ratio), np.arange(30))
