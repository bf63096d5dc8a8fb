"""kvgrad (KVgrad, https://openreview.net/forum?id=cg1wTCJjjk), as kvpress's KVgradPress defines it: input × gradient
attribution of each cached pair through kvzip's context-reconstruction replay.

The replay is kvzip's (the same "repeat the context" inputs, chunking and chat-template handling), in chunks of
512 tokens. For layer ℓ, context pair c of kv-head h, replay token p and query head g of h's group:

    S = max over p, g of  A_{g,p,c} · ‖W_o,g · v_c‖₂ · ‖∂Φ/∂a_p‖₂

A is kvzip's reconstruction attention (softmax over the sinks, the chunk and the replay tokens); ‖W_o,g · v_c‖
the size of what the pair writes into the residual stream through query head g's slice of the output projection;
a_p layer ℓ's attention output at replay token p (the residual after attention differs from it by a constant, so
the gradients agree); Φ = Σ_p ‖h_p‖² over the replay tokens' last decoder-layer outputs (before the final norm).
mx.value_and_grad gives ∂Φ/∂a (`kvcore.capture.reconstruction.replay_gradients`); weights and the context's rows
are constants. KVzip+ does not apply (the ‖W_o·v‖ factor is always there). Selection is kvzip's: global across
layers and kv-heads (`layerwise`: the same count per layer), the first `n_sink` positions never evicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kvcore.capture import reconstruction
from kvcore.declared import param
from kvcore.methods.kvzip import KVzip, _output_norms, chunk_scores

#: kvpress's KVgradPress chunk_size: context tokens per replay (each one forward and one backward pass).
KVGRAD_CHUNK = 512


@dataclass(frozen=True)
class KVgrad(KVzip):
    name = "kvgrad"
    description = (
        "KVgrad (openreview cg1wTCJjjk): max over a context-repeating replay of attention × ‖W_o·v‖ × "
        "‖∂Φ/∂attention output‖ (Φ = Σ‖last hidden‖²); lowest evicted across layers and heads"
    )
    paper = "KVgrad, input × gradient attribution of KV pairs (as kvpress 0.5.5 cites it), openreview.net/forum?id=cg1wTCJjjk"

    #: not a parameter here: kvpress fixes it off (the ‖W_o·v‖ factor is part of the score)
    kvzip_plus_normalization: int = field(default=0, init=False, repr=False)
    chunk_size: int = param(
        KVGRAD_CHUNK, "context tokens per replay (one forward and one backward pass each)", minimum=1
    )

    @property
    def reconstruction_key(self) -> tuple:
        """What the cached scores depend on (not `layerwise`: that is selection)."""
        return ("kvgrad", self.n_sink, self.chunk_size)

    def chunk_pass(
        self, model: nn.Module, cache: list[Any], start: int, end: int, input_ids: list[int]
    ) -> dict[int, mx.array]:
        """Per layer, [H_kv, end - start]: the scores of context[start:end] from one differentiated replay."""
        found: dict[int, mx.array] = {}

        def observe(layer, queries, keys, values, scale, gradient_norms) -> list[mx.array]:
            # the replay has checked that the model has `layers` and their attention an o_proj (W_o)
            attn = model.layers[layer].self_attn
            value_norms = _output_norms(attn, values[0, :, start:end], keys.shape[1])
            # chunk_scores divides each reconstruction row by its `row_norms`: the reciprocal multiplies by ‖∂Φ/∂a_p‖
            found[layer] = chunk_scores(
                queries[0], keys[0], start, end, self.n_sink, scale, 1.0 / gradient_norms, value_norms
            )
            return [found[layer]]

        reconstruction.replay_gradients(model, cache, input_ids, observe)
        return found
