"""Column binning for the heatmap: what falls into one screen pixel becomes one image column.

36 layers x 8 kv-heads x 32,768 positions is 9.4 M cells, 38 MB of RGBA; a screen shows ~1,500 columns. The
heatmap colours bins of `width` consecutive positions instead of cells: the kept fraction of each bin (so a
pixel half kept is half lit), and the mean of scores or quantization error. At width 1 every function returns
the cells themselves, so zoomed in the image is exact.
"""

from __future__ import annotations

import math

import numpy as np


def bin_width(n_columns: int, n_pixels: float) -> int:
    """Positions per image column so that `n_columns` fit into `n_pixels` (at least 1)."""
    if n_columns <= 0:
        return 1
    return max(1, math.ceil(n_columns / max(n_pixels, 1.0)))


def bin_sizes(n_columns: int, width: int) -> np.ndarray:
    """Positions in each bin: `width` each, the last one possibly narrower."""
    n = -(-n_columns // width)
    sizes = np.full(n, width, dtype=np.int64)
    if n:
        sizes[-1] = n_columns - (n - 1) * width
    return sizes


def bin_counts(mask: np.ndarray, width: int) -> np.ndarray:
    """(rows, n_bins) True cells per bin of `width` columns of a (rows, T) bool mask.

    Sums `width` strided slices: ~3x faster than a reshape-and-sum over the short bin axis (measured 3.5 ms
    against 12 ms at 288 x 32,768, width 22), because every add runs over long contiguous-ish rows.
    """
    u = np.ascontiguousarray(mask).view(np.uint8)
    rows, T = u.shape
    if width == 1:
        return u
    full = T // width
    dtype = np.uint8 if width <= 255 else np.uint16
    acc = u[:, 0 : full * width : width].astype(dtype)
    for j in range(1, width):
        acc += u[:, j : full * width : width]
    if full * width < T:
        tail = u[:, full * width :].sum(axis=1, dtype=dtype)[:, None]
        acc = np.concatenate([acc, tail], axis=1)
    return acc


def bin_means(values: np.ndarray, width: int) -> np.ndarray:
    """(rows, n_bins) float32 mean of each bin (NaN if any cell of the bin is NaN)."""
    if width == 1:
        return values
    T = values.shape[1]
    sums = np.add.reduceat(values, np.arange(0, T, width), axis=1, dtype=np.float32)
    return sums / bin_sizes(T, width).astype(np.float32)


def bin_masked_means(values: np.ndarray, mask: np.ndarray, counts: np.ndarray, width: int) -> np.ndarray:
    """(rows, n_bins) mean of `values` over the cells where `mask` holds (NaN for a bin with none)."""
    if width == 1:
        return np.where(mask, values, np.nan).astype(np.float32)
    T = values.shape[1]
    sums = np.add.reduceat(np.where(mask, values, 0).astype(np.float32), np.arange(0, T, width), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan).astype(np.float32)


def fraction_index(counts: np.ndarray, width: int, n_columns: int) -> np.ndarray:
    """0..255 LUT index of each bin's kept fraction (0 = none kept, 255 = all kept)."""
    if width == 1:
        return counts.astype(np.uint8) * np.uint8(255)
    sizes = bin_sizes(n_columns, width).astype(np.float64)
    return np.rint(counts * 255.0 / sizes).astype(np.uint8)  # exact halves round to even, as np.rint does
