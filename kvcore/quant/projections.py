"""Seeded random matrices the sketching schemes regenerate instead of storing: a rotation and a Gaussian sketch.

Both are rebuilt from (size, seed) on first use and cached, so they cost no stored bytes; the seed is a declared
parameter of the scheme. Streams are kept apart by a tag, so a scheme's rotation and its sketch are independent.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx
import numpy as np

from kvcore.quant.rotated import hadamard_refusal, rotation_matrix

_SKETCH_STREAM = 1
_ROTATION_STREAM = 2


@cache
def random_rotation(head_dim: int, seed: int) -> mx.array:
    """R [head_dim, head_dim] float32, orthogonal, rows rotated as x·R: the rotated scheme's randomized Hadamard
    where mx.hadamard_transform takes head_dim, else Q of the QR of a seeded Gaussian matrix (Haar-distributed
    once Q's columns take the signs of R's diagonal)."""
    if hadamard_refusal(head_dim) is None:
        return rotation_matrix(head_dim, seed)
    g = np.random.default_rng([seed, _ROTATION_STREAM]).standard_normal((head_dim, head_dim))
    q, r = np.linalg.qr(g)
    q = q * np.sign(np.diag(r))[None, :]
    out = mx.array(q.astype(np.float32))
    mx.eval(out)
    return out


@cache
def gaussian_sketch(m: int, head_dim: int, seed: int) -> mx.array:
    """S [m, head_dim] float32 with i.i.d. N(0, 1) entries: the Johnson–Lindenstrauss projection of QJL."""
    s = np.random.default_rng([seed, _SKETCH_STREAM]).standard_normal((m, head_dim)).astype(np.float32)
    out = mx.array(s)
    mx.eval(out)
    return out
