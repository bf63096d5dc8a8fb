"""Next-token logits of the dense and a compressed cache on the dense continuation, from the definition.

Independent of Session's own passes: the dense rows come from one cache-less forward pass over the prompt and
the continuation; the compressed rows feed the continuation through a copy of the compressed cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache import sparse as caches


def dense_logits(model: Any, prompt_ids: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
    """[n, V]: row i predicts tokens[i] from the prompt and tokens[:i]."""
    out = model(mx.array([[*prompt_ids, *tokens[:-1]]]))[0, len(prompt_ids) - 1 :]
    return np.array(out.astype(mx.float32))


def compressed_logits(
    model: Any,
    cache: list[Any],
    prompt_ids: Sequence[int],
    tokens: Sequence[int],
    schedule: str,
    dense: np.ndarray,
) -> np.ndarray:
    """[n, V] from a compressed cache: under "paper" it holds the whole prompt and the first row is the dense
    prefill's (`dense[0]`); under "mlx-lm" it lacks the last prompt token, which is fed first."""
    feed = list(tokens[:-1]) if schedule == "paper" else [prompt_ids[-1], *tokens[:-1]]
    rows = [dense[:1]] if schedule == "paper" else []
    if feed:
        rows.append(np.array(model(mx.array([feed]), cache=caches.copy_cache(cache))[0].astype(mx.float32)))
    return np.concatenate(rows, axis=0)
