"""Pre-RoPE keys from the cached (post-RoPE) ones: the layer's own rope module run backwards.

RoPE rotates position p by p·θ, so rotating by −p·θ undoes it. Feeding the keys in reverse order at offset −(T−1)
gives position p the angle −p·θ with the model's own frequencies (llama3 / yarn scaling, partial rotary dims),
so nothing is recomputed from the weights and no second copy of the keys is kept during prefill.
"""

from __future__ import annotations

import mlx.core as mx

from kvcore.capture.prefill import LayerObservation


def pre_rope_keys(obs: LayerObservation, method: str) -> mx.array:
    """The layer's keys before RoPE [H_kv, T, D], float32; ValueError naming `method` where it cannot."""
    if obs.latent:
        raise ValueError(
            f"{method} does not score multi-head latent attention (MLA) layers: choose another method"
        )
    if obs.rope is None:
        raise ValueError(
            f"{method} needs the keys before RoPE, which KV Lens recovers with the layer's rope module recorded at "
            "prefill; this layer's queries did not pass through a `rope` module KV Lens could tap (or the session "
            "came from a file): prefill again, or choose another method for this model"
        )
    n_tokens = obs.n_tokens
    keys = obs.keys.astype(mx.float32)[None, :, ::-1]  # [1, H_kv, T, D], last position first
    return obs.rope(keys, offset=-(n_tokens - 1))[0, :, ::-1]
