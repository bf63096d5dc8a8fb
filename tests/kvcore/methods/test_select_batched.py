"""The batched select_positions (issue 15) builds the same caches, bit for bit, as the per-layer path before it."""

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from benchmarks import select_positions_before as before
from kvcore.cache import index_checks
from kvcore.cache import sparse as caches
from kvcore.capture.prefill import prefill_with_capture
from kvcore.methods.selection import device_select, rank, select
from tests.kvcore.conftest import PROMPT, run


def _same(new: list, old: list) -> None:
    for a, b in zip(new, old, strict=True):
        assert type(a) is type(b)
        if not isinstance(a, caches._SparseRows):
            assert a is b
            continue
        assert a.offset == b.offset and a.n_kept == b.n_kept and a.n_prefix == b.n_prefix
        assert np.array_equal(a._prefix_counts, b._prefix_counts)
        assert np.array_equal(np.asarray(a._selection), np.asarray(b._selection))
        assert [p.tolist() for p in a.retained_positions] == [p.tolist() for p in b.retained_positions]
        for x, y in zip(caches._arrays(a), caches._arrays(b), strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert np.array_equal(np.asarray(x.view(mx.uint8)), np.asarray(y.view(mx.uint8)))


@pytest.fixture(scope="module")
def captured(models):
    out = {}
    for arch, (model, tok) in models.items():
        ids = tok.encode(PROMPT * 3)
        out[arch] = (model, prefill_with_capture(model, ids, window=64, chunk_size=16, h2o="lazy"))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("method", ["knorm", "snapkv", "h2o", "streaming_llm"])
def test_batched_equals_per_layer_path(captured, arch, method):
    model, cap = captured[arch]
    ranking = rank(cap.observations, method)
    packed = caches.quantize_cache(cap.cache, bits=4, group_size=32)
    for ratio in (0.1, 0.37, 1.0):
        modes = [dict(per_head=True), dict(per_head=False)]
        if method in ("knorm", "snapkv", "h2o"):
            modes.append(dict(per_head=True, adakv=True))
        for mode in modes:
            sel = select(ranking, ratio, **mode)
            for validate in (True, False):
                _same(caches.select_positions(cap.cache, sel, validate=validate),
                      before.select_positions(cap.cache, sel, validate=validate))  # fmt: skip
            _same(caches.select_positions(packed, sel), before.select_positions(packed, sel))
            # Selecting again from a sparse (ragged or not) cache with appended tokens composes the same way.
            first = caches.select_positions(cap.cache, sel, logical_offset=cap.n_tokens + 3)
            run(model, first, [5, 7])
            n = min(int(c.kept_counts.min()) for c in first)
            again = [
                np.arange(0, n, 2),
                None,
                *[np.stack([np.arange(1, n, 3)] * c.n_heads) for c in first[2:]],
            ]
            _same(caches.select_positions(first, again), before.select_positions(first, again))
            ragged = [[np.arange(0, max(1, k - 1)) for k in c.kept_counts] for c in first]
            _same(caches.select_positions(first, ragged), before.select_positions(first, ragged))


def test_mx_indices_are_read_once_and_match(captured):
    model, cap = captured["llama"]
    sel = select(rank(cap.observations, "knorm"), 0.4, adakv=True)
    as_mx = [[mx.array(a) for a in layer] for layer in sel]
    _same(caches.select_positions(cap.cache, as_mx), before.select_positions(cap.cache, sel))


@pytest.mark.parametrize("method", ["knorm", "streaming_llm", "full", "pyramidkv"])
def test_device_selection_builds_the_same_caches(captured, method):
    """Session's GPU slider path: the kept rows sorted on the device from the ranking's orders, nothing uploaded."""
    _, cap = captured["llama"]
    ranking = rank(cap.observations, method)
    packed = caches.quantize_cache(cap.cache, bits=4, group_size=32)
    modes = [dict(per_head=True), dict(per_head=False)]
    if method == "knorm":
        modes.append(dict(per_head=True, adakv=True))
    for ratio in (0.1, 0.37, 1.0):
        for mode in modes:
            sel = select(ranking, ratio, **mode)
            on_device = device_select(ranking, sel)
            host = [
                index_checks.host_indices(s, c.keys.shape[1], "")[0]
                for s, c in zip(sel, cap.cache, strict=True)
            ]
            assert all(np.array_equal(np.asarray(d), h) for d, h in zip(on_device, host, strict=True))
            for source in (cap.cache, packed):
                _same(caches.select_positions(source, sel, validate=False, device_indices=on_device),
                      before.select_positions(source, sel))  # fmt: skip


def test_device_indices_must_be_trusted(captured):
    _, cap = captured["llama"]
    ranking = rank(cap.observations, "knorm")
    sel = select(ranking, 0.5)
    with pytest.raises(ValueError, match="validate=False"):
        caches.select_positions(cap.cache, sel, device_indices=device_select(ranking, sel))


def test_device_selection_sorts_each_budget_of_the_stack(captured):
    """Layers of different budgets (pyramidkv's) are sorted in groups of the stacked orders, rows picked per layer."""
    _, cap = captured["llama"]
    ranking = rank(cap.observations, "snapkv")
    sel = [
        None if s is None else s[:, : max(1, s.shape[1] - 3 * i)] for i, s in enumerate(select(ranking, 0.8))
    ]
    sel = [
        None if s is None else np.sort(ranking.layers[i].order[:, : s.shape[1]], axis=1)
        for i, s in enumerate(sel)
    ]
    assert len({s.shape[1] for s in sel if s is not None}) > 1
    on_device = device_select(ranking, sel)
    assert all(np.array_equal(np.asarray(d), s) for d, s in zip(on_device, sel, strict=True) if s is not None)


def test_device_selection_declines_orders_of_different_shapes(captured):
    """Without one stack of orders (layers of different shapes) device_select says so, and the host path serves."""
    _, cap = captured["llama"]
    ranking = rank(cap.observations, "knorm")
    first = ranking.layers[0]
    ranking.layers[0] = replace(first, order=first.order[:1], scores=first.scores[:1])
    assert device_select(ranking, select(rank(cap.observations, "knorm"), 0.5)) is None
