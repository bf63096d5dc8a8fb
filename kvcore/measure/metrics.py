"""Quality metrics of a compressed cache against the dense (B0) baseline, on NumPy arrays.

Teacher-forced metrics feed the dense greedy continuation to both caches, so every step compares the two
distributions on the same history; the free-running continuation gives the first divergence a user sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable log-softmax over the last axis, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _check_shapes(dense_logits: np.ndarray, comp_logits: np.ndarray, targets: np.ndarray) -> None:
    if dense_logits.shape != comp_logits.shape or dense_logits.shape[0] != len(targets):
        raise ValueError(
            f"shapes differ: dense {dense_logits.shape}, compressed {comp_logits.shape}, targets {len(targets)}"
        )


def _kl(p_dense: np.ndarray, lp_dense: np.ndarray, lp_comp: np.ndarray) -> np.ndarray:
    """KL(dense ‖ compressed) per row from the dense probabilities and both log-probabilities (clipped at 0)."""
    return np.maximum((p_dense * (lp_dense - lp_comp)).sum(axis=-1), 0.0)


def teacher_forced(dense_logits: np.ndarray, comp_logits: np.ndarray, targets: np.ndarray) -> dict:
    """Agreement, KL(dense ‖ compressed) per step (mean, max) and NLL delta on the dense continuation.

    dense_logits, comp_logits: [n, V] logits predicting targets[i] at step i; targets: [n] token ids.
    """
    _check_shapes(dense_logits, comp_logits, targets)
    lp_d = log_softmax(dense_logits)
    return _summary(lp_d, np.exp(lp_d), log_softmax(comp_logits), comp_logits, np.asarray(targets))


def _summary(
    lp_d: np.ndarray, p_d: np.ndarray, lp_c: np.ndarray, comp_logits: np.ndarray, targets: np.ndarray
):
    rows = np.arange(len(targets))
    return _summary_of_rows(
        _kl(p_d, lp_d, lp_c),
        comp_logits.argmax(axis=-1) == targets,
        -lp_d[rows, targets],
        -lp_c[rows, targets],
    )


def _summary_of_rows(kl: np.ndarray, agree: np.ndarray, nll_d: np.ndarray, nll_c: np.ndarray) -> dict:
    """The teacher-forced summary from its per-step rows: KL, top-1 agreement and both NLLs of the target."""
    if len(kl) == 0:
        return {"agreement": float("nan"), "kl_mean": float("nan"), "kl_max": float("nan"), "nll_delta": 0.0}
    return {
        "agreement": float(agree.mean()),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "kl_per_step": kl.tolist(),
        "nll_dense": float(nll_d.mean()),
        "nll_compressed": float(nll_c.mean()),
        "nll_delta": float(nll_c.mean() - nll_d.mean()),
    }


#: Candidates shown per generated token for each cache (the per-token view's hover).
TOP_K = 5
#: Rows compared at once: an 8k-token continuation over a 128k vocabulary would hold n × V float64 arrays (8 GB
#: each) if compared whole; in blocks it holds block × V.
COMPARE_BLOCK = 256


@dataclass(frozen=True)
class StepMetrics:
    """Per generated token i, teacher-forced: both caches predict dense token i from the same history."""

    kl: np.ndarray  # [n] KL(dense ‖ compressed)
    agreement: np.ndarray  # [n] bool: the compressed top-1 is the dense token
    dense_top_ids: np.ndarray  # [n, k] by descending probability
    dense_top_probs: np.ndarray  # [n, k]
    compressed_top_ids: np.ndarray  # [n, k]
    compressed_top_probs: np.ndarray  # [n, k]


def _top_k(lp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most probable ids per row [n, k] of log-probabilities (descending, ties by lower id) and their
    probabilities; a partition first, so a 128k vocabulary is not sorted whole."""
    k = min(k, lp.shape[-1])
    part = np.argpartition(-lp, k - 1, axis=-1)[:, :k]
    vals = np.take_along_axis(lp, part, axis=-1)
    order = np.lexsort((part, -vals), axis=-1)
    ids = np.take_along_axis(part, order, axis=-1)
    return ids, np.exp(np.take_along_axis(lp, ids, axis=-1))


def per_step(
    dense_logits: np.ndarray, comp_logits: np.ndarray, targets: np.ndarray, k: int = TOP_K
) -> StepMetrics:
    """KL, top-1 agreement and both top-k per step; the same definitions as `teacher_forced`, unaveraged."""
    _check_shapes(dense_logits, comp_logits, targets)
    return compare(reference(dense_logits, k), comp_logits, np.asarray(targets), len(targets), k)[1]


@dataclass(frozen=True)
class Reference:
    """The dense side of every comparison of one prefill, computed once: each regenerate then computes only the
    compressed side (a 128k vocabulary makes each float64 log-softmax of 32 steps ~30 ms). Each row's max and
    log-normaliser are kept, not its n × V float64 log-softmax, which `lp` rebuilds exactly for a block of rows."""

    logits: np.ndarray
    shift: np.ndarray  # [n, 1] float64: each row's max
    log_z: np.ndarray  # [n, 1] float64: log Σ exp(row − max)
    top_ids: np.ndarray
    top_probs: np.ndarray

    def lp(self, lo: int, hi: int) -> np.ndarray:
        """log_softmax of rows lo … hi − 1, the same operations as `log_softmax` (bit for bit)."""
        return (np.asarray(self.logits[lo:hi], dtype=np.float64) - self.shift[lo:hi]) - self.log_z[lo:hi]


def reference(dense_logits: np.ndarray, k: int = TOP_K) -> Reference:
    logits = np.asarray(dense_logits)
    n = len(logits)
    shift, log_z = np.empty((n, 1)), np.empty((n, 1))
    ids, probs = [], []
    for lo in range(0, max(n, 1), COMPARE_BLOCK):
        x = np.asarray(logits[lo : lo + COMPARE_BLOCK], dtype=np.float64)
        shift[lo : lo + len(x)] = x.max(axis=-1, keepdims=True) if len(x) else 0.0
        x = x - shift[lo : lo + len(x)]
        log_z[lo : lo + len(x)] = np.log(np.exp(x).sum(axis=-1, keepdims=True))
        i, p = _top_k(x - log_z[lo : lo + len(x)], k)
        ids.append(i)
        probs.append(p)
    return Reference(logits, shift, log_z, np.concatenate(ids), np.concatenate(probs))


def compare(
    ref: Reference, comp_logits: np.ndarray, targets: np.ndarray, skip: int, k: int = TOP_K
) -> tuple[dict, StepMetrics]:
    """(`teacher_forced` over steps skip…n−1, `per_step` over all n) with one log-softmax of the compressed side,
    `COMPARE_BLOCK` rows at a time (each row's numbers are those of the whole-array definitions)."""
    n = len(targets)
    _check_shapes(ref.logits[:n], comp_logits, targets)
    targets = np.asarray(targets)
    kl, nll_d, nll_c = np.empty(n), np.empty(n), np.empty(n)
    comp_ids, comp_probs = [], []
    for lo in range(0, max(n, 1), COMPARE_BLOCK):
        hi = min(n, lo + COMPARE_BLOCK)
        lp_d, lp_c = ref.lp(lo, hi), log_softmax(comp_logits[lo:hi])
        kl[lo:hi] = _kl(np.exp(lp_d), lp_d, lp_c)
        rows, t = np.arange(hi - lo), targets[lo:hi]
        nll_d[lo:hi], nll_c[lo:hi] = -lp_d[rows, t], -lp_c[rows, t]
        i, p = _top_k(lp_c, k)
        comp_ids.append(i)
        comp_probs.append(p)
    agreement = comp_logits.argmax(axis=-1) == targets
    steps = StepMetrics(
        kl=kl,
        agreement=agreement,
        dense_top_ids=ref.top_ids[:n, :k],
        dense_top_probs=ref.top_probs[:n, :k],
        compressed_top_ids=np.concatenate(comp_ids),
        compressed_top_probs=np.concatenate(comp_probs),
    )
    summary = _summary_of_rows(kl[skip:], agreement[skip:], nll_d[skip:], nll_c[skip:])
    return summary, steps


def kept_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per layer |A ∩ B| / |A ∪ B| of two kept masks [L, H_kv, T]: the (kv-head, position) pairs each keeps.

    1 where both keep nothing (two empty sets are the same set).
    """
    if a.shape != b.shape:
        raise ValueError(f"kept masks differ in shape: {a.shape} and {b.shape}")
    both = (a & b).sum(axis=(1, 2))
    either = (a | b).sum(axis=(1, 2))
    return np.where(either > 0, both / np.maximum(either, 1), 1.0)


def first_divergence(dense_tokens: Sequence[int], comp_tokens: Sequence[int]) -> int | None:
    """Index of the first generated token that differs, or None if the shorter run matches throughout."""
    for i, (a, b) in enumerate(zip(dense_tokens, comp_tokens, strict=False)):
        if a != b:
            return i
    return None


def attention_mass_kept(window_attention: np.ndarray, kept: Sequence[np.ndarray]) -> np.ndarray:
    """Per kv-head share of the window queries' attention that falls on kept positions.

    window_attention: [H_kv, T] mean attention of the window queries (rows sum to 1 over the prompt);
    kept: per kv-head arrays of kept prompt positions (positions ≥ T, i.e. generated tokens, are ignored).
    """
    T = window_attention.shape[1]
    out = np.empty(window_attention.shape[0], dtype=np.float64)
    for h, pos in enumerate(kept):
        pos = np.asarray(pos)
        out[h] = float(window_attention[h, pos[pos < T]].sum())
    return out


def pooled_rmse(row_rmse: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per head, the RMSE over all its valid rows from each row's RMSE over head_dim [H, n] (0 for no rows).

    Rows have equal width, so the mean of the rows' squared RMSE is the mean squared error of the whole head:
    the session keeps per-row errors for the heatmap and pools them here instead of a second pass over the data.
    """
    sq = np.where(valid, np.asarray(row_rmse, dtype=np.float64) ** 2, 0.0).sum(axis=1)
    return np.sqrt(sq / np.maximum(valid.sum(axis=1), 1))
