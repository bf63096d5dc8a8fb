"""The order `torch.topk(scores, k)` (largest, sorted) returns on a CPU, equal scores included.

Why KV Lens needs it: kvpress's DecodingPress gathers the rows it keeps in `topk` order, and the next compression
scores the rows in that stored order — snapkv's average pooling runs along it. Rows with equal scores (snapkv's
observation window, all padded to one value; knorm's keys of one token at several positions) come out of `topk` in
an order its documentation leaves open; on a CPU it is fixed by the algorithms PyTorch calls: over (score, index)
pairs compared by score alone, `std::partial_sort` when k · 64 ≤ n, else `std::nth_element` at k − 1 then
`std::sort` of the first k − 1 (libstdc++: introselect / introsort with median-of-three pivots, insertion sort
below 16 elements, heaps past the depth limit). This module is a plain rendering of those algorithms, so the
kvpress form of a decoding policy stores its rows in the order kvpress on a CPU does (a GPU's topk orders ties
otherwise). Pure Python: meant for parity runs, a few milliseconds a head at a few hundred rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["torch_cpu_topk"]

#: libstdc++'s size below which its sorts finish by insertion sort.
_THRESHOLD = 16

_Less = Callable[[int, int], bool]


def torch_cpu_topk(scores: Sequence[float] | np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores, in the order torch.topk returns them on a CPU (ties included)."""
    values = [float(v) for v in np.asarray(scores).tolist()]
    n = len(values)
    if not 0 <= k <= n:
        raise ValueError(f"topk of {k} from {n} scores: k must be between 0 and {n}")
    order = list(range(n))
    if k == 0:
        return np.zeros(0, np.int64)

    def before(a: int, b: int) -> bool:  # "a comes first": larger score (NaN first, as torch)
        x, y = values[a], values[b]
        return (x != x and y == y) or x > y

    if k * 64 <= n:
        _heap_select(order, 0, k, n, before)
        _sort_heap(order, 0, k, before)
    else:
        _introselect(order, 0, k - 1, n, 2 * _log2(n), before)
        _sort(order, 0, k - 1, before)
    return np.array(order[:k], np.int64)


def _log2(n: int) -> int:
    return n.bit_length() - 1


def _median_to_first(q: list[int], result: int, a: int, b: int, c: int, less: _Less) -> None:
    if less(q[a], q[b]):
        pick = b if less(q[b], q[c]) else c if less(q[a], q[c]) else a
    else:
        pick = a if less(q[a], q[c]) else c if less(q[b], q[c]) else b
    q[result], q[pick] = q[pick], q[result]


def _partition(q: list[int], first: int, last: int, pivot: int, less: _Less) -> int:
    while True:
        while less(q[first], q[pivot]):
            first += 1
        last -= 1
        while less(q[pivot], q[last]):
            last -= 1
        if first >= last:
            return first
        q[first], q[last] = q[last], q[first]
        first += 1


def _partition_pivot(q: list[int], first: int, last: int, less: _Less) -> int:
    _median_to_first(q, first, first + 1, first + (last - first) // 2, last - 1, less)
    return _partition(q, first + 1, last, first, less)


def _linear_insert(q: list[int], last: int, less: _Less) -> None:
    value = q[last]
    while less(value, q[last - 1]):
        q[last] = q[last - 1]
        last -= 1
    q[last] = value


def _insertion_sort(q: list[int], first: int, last: int, less: _Less) -> None:
    for i in range(first + 1, last):
        if less(q[i], q[first]):
            q[first : i + 1] = [q[i], *q[first:i]]
        else:
            _linear_insert(q, i, less)


def _introselect(q: list[int], first: int, nth: int, last: int, depth: int, less: _Less) -> None:
    while last - first > 3:
        if depth == 0:
            _heap_select(q, first, nth + 1, last, less)
            q[first], q[nth] = q[nth], q[first]
            return
        depth -= 1
        cut = _partition_pivot(q, first, last, less)
        if cut <= nth:
            first = cut
        else:
            last = cut
    _insertion_sort(q, first, last, less)


def _introsort_loop(q: list[int], first: int, last: int, depth: int, less: _Less) -> None:
    while last - first > _THRESHOLD:
        if depth == 0:
            _heap_select(q, first, last, last, less)
            _sort_heap(q, first, last, less)
            return
        depth -= 1
        cut = _partition_pivot(q, first, last, less)
        _introsort_loop(q, cut, last, depth, less)
        last = cut


def _sort(q: list[int], first: int, last: int, less: _Less) -> None:
    if last - first < 2:
        return
    _introsort_loop(q, first, last, 2 * _log2(last - first), less)
    if last - first > _THRESHOLD:
        _insertion_sort(q, first, first + _THRESHOLD, less)
        for i in range(first + _THRESHOLD, last):
            _linear_insert(q, i, less)
    else:
        _insertion_sort(q, first, last, less)


def _push_heap(q: list[int], base: int, hole: int, top: int, value: int, less: _Less) -> None:
    parent = (hole - 1) // 2
    while hole > top and less(q[base + parent], value):
        q[base + hole] = q[base + parent]
        hole, parent = parent, (parent - 1) // 2
    q[base + hole] = value


def _adjust_heap(q: list[int], base: int, hole: int, length: int, value: int, less: _Less) -> None:
    top = child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if less(q[base + child], q[base + child - 1]):
            child -= 1
        q[base + hole] = q[base + child]
        hole = child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        q[base + hole] = q[base + child - 1]
        hole = child - 1
    _push_heap(q, base, hole, top, value, less)


def _heap_select(q: list[int], first: int, middle: int, last: int, less: _Less) -> None:
    length = middle - first
    for parent in range((length - 2) // 2, -1, -1) if length >= 2 else ():
        _adjust_heap(q, first, parent, length, q[first + parent], less)
    for i in range(middle, last):
        if less(q[i], q[first]):
            _pop_heap(q, first, middle, i, less)


def _pop_heap(q: list[int], first: int, last: int, result: int, less: _Less) -> None:
    value = q[result]
    q[result] = q[first]
    _adjust_heap(q, first, 0, last - first, value, less)


def _sort_heap(q: list[int], first: int, last: int, less: _Less) -> None:
    while last - first > 1:
        last -= 1
        _pop_heap(q, first, last, last, less)
