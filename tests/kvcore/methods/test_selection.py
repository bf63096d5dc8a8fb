"""Selection: output forms for select_positions, validation, and that a new ratio never rescores."""

import mlx.core as mx
import numpy as np
import pytest

from kvcore import methods
from kvcore.methods import selection
from tests.kvcore.methods.helpers import observation, random_qk


@pytest.fixture(scope="module")
def observations():
    return [observation(*random_qk(50 + layer, 120, 2, 2, 16)) for layer in range(3)] + [None]


def test_registry_lists_and_builds_every_method():
    assert {"full", "streaming_llm", "snapkv", "h2o", "tova", "knorm", "random", "pyramidkv", "adakv"} <= set(
        methods.available()
    )
    for name in methods.available():
        assert methods.get(name).name in name


def test_unknown_method_names_the_allowed_ones():
    with pytest.raises(
        ValueError, match=r"unknown method 'snapKV'; methods: full, .*snapkv.*; wrappers .*adakv"
    ):
        methods.get("snapKV")


@pytest.mark.parametrize(
    ("params", "message"),
    [({"window": 0}, "window must be an integer >= 1, got 0"), ({"kernel": 4}, "kernel must be an odd")],
)
def test_bad_params_are_refused(params, message):
    with pytest.raises(ValueError, match=message):
        methods.get("snapkv", **params)


@pytest.mark.parametrize("ratio", [0.0, 1.5, -1])
def test_bad_ratio_is_refused(observations, ratio):
    ranking = selection.rank(observations, "snapkv")
    with pytest.raises(ValueError, match="ratio must be in"):
        selection.select(ranking, ratio)


def test_output_forms_feed_select_positions(observations):
    per_head = selection.select(selection.rank(observations, "knorm"), 0.25)
    assert per_head[-1] is None and per_head[0].shape == (2, 30) and per_head[0].dtype == np.int32
    shared = selection.select(selection.rank(observations, "knorm"), 0.25, per_head=False)
    assert shared[0].shape == (30,)
    ragged = selection.select(selection.rank(observations, "adakv"), 0.25)
    assert isinstance(ragged[0], list) and sum(map(len, ragged[0])) == 60
    for layer in [*per_head[:-1], *shared[:-1]]:
        assert np.all(np.diff(layer, axis=-1) > 0)


def test_a_new_ratio_is_a_slice_not_a_rescore(observations, monkeypatch):
    ranking = selection.rank(observations, "snapkv")
    monkeypatch.setattr(type(methods.get("snapkv")), "scores", lambda *a: pytest.fail("rescored"))
    monkeypatch.setattr(mx, "eval", lambda *a: pytest.fail("MLX work on a ratio change"))
    previous = None
    for ratio in np.linspace(0.05, 1.0, 20):
        kept = selection.select(ranking, float(ratio))
        selection.select(ranking, float(ratio), adakv=True)
        if previous is not None:  # a slice of one ranking: a larger ratio keeps a superset, head by head
            for small, large in zip(previous[:-1], kept[:-1], strict=True):
                for h in range(small.shape[0]):
                    assert set(small[h].tolist()) <= set(large[h].tolist())
        previous = kept
    # Its speed is timed where timings belong: benchmarks/bench_recompress.py (select + gather, BENCHMARKS.md).
