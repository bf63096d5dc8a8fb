"""kvzap (Jegou et al. 2026, "KVzap: fast, adaptive and faithful KV cache pruning"; kvpress's KVzapPress): a small
surrogate per layer predicts each pair's kvzip+ importance from the row entering the layer's attention.

Score of position t in kv-head h = surrogate_ℓ(x_t)[h], x_t the attention input (after the layer's input norm),
the surrogate a linear map or a two-layer MLP (hidden → 512 → GELU → H_kv, kvpress's default `mlp`) trained to
predict log(kvzip+ score) (`kvlens calibrate kvzap`, `kvcore.engine.kvzap_calibration`). Selection is any
scorer's: top n per kv-head, no sinks, as kvpress's ScorerPress; `dms-kvzap` is kvpress's intended pairing (a
threshold on the log-score, a protected recent window). kvpress downloads surrogates for a few models; KV Lens
trains one for any model on the user's prompts.

The capture records no hidden states (an 8B model's would rival its cache), so scoring runs the context once
more through the model with each layer's attention input tapped (`kvcore.capture.attention_input`), keeping only
the surrogate's [H_kv, N] per chunk; Session runs it before ranking (`reconstruct`) and caches the scores in the
observations, as kvzip's replay.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from kvcore.capture import attention_input
from kvcore.capture.prefill import CaptureResult, LayerObservation
from kvcore.declared import param
from kvcore.methods import kvzap_surrogate
from kvcore.methods.base import Method

#: Context positions run through the model per forward call of the scoring pass (the prefill's chunk).
SCORING_CHUNK = 2048


@dataclass(frozen=True)
class KVzap(Method):
    name = "kvzap"
    description = (
        "KVzap (Jegou et al. 2026): a per-layer surrogate, trained on kvzip+ scores (calibrated per model), "
        "scores each pair from the attention input"
    )
    paper = "KVzap: Fast, Adaptive, and Faithful KV Cache Pruning (Jegou et al. 2026), arXiv:2601.07891"
    calibration: ClassVar[str] = "kvzap"
    needs_reconstruction = True

    model_type: int = param(
        0, "surrogate: 0 = mlp (2 layers, GELU), 1 = linear", choices=kvzap_surrogate.MODEL_TYPES
    )
    artifact: Any = dataclasses.field(default=None, compare=False, repr=False)
    artifact_digest: str = dataclasses.field(default="", repr=False)

    @property
    def surrogate_type(self) -> str:
        return kvzap_surrogate.MODEL_TYPES[self.model_type]

    def load_calibration(self, fingerprint: str, model: str) -> kvzap_surrogate.Surrogate:
        """The trained surrogate of this type (kvcore.methods.calibration.bind calls it instead of `load`)."""
        return kvzap_surrogate.load(self.surrogate_type, fingerprint, model)

    def with_artifact(self, artifact: kvzap_surrogate.Surrogate) -> KVzap:
        return dataclasses.replace(self, artifact=artifact, artifact_digest=artifact.digest)

    @property
    def reconstruction_key(self) -> tuple:
        return ("kvzap", self.model_type, self.artifact_digest)

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        found = obs.reconstruction.get(self.reconstruction_key)
        if found is None:
            raise ValueError(
                "kvzap scores come from a pass over the attention inputs: rank it through Session "
                f"(which runs the pass), after `{kvzap_surrogate.calibrate_command(self.surrogate_type, 'M')}`"
            )
        return found

    def reconstruct(
        self, model: nn.Module, tokenizer: Any, capture: CaptureResult, ids: list[int], templated: bool
    ) -> int:
        """Run `ids` through the model with the attention inputs tapped and cache each observed layer's surrogate
        scores [H_kv, T]; returns the forward calls."""
        if self.artifact is None:
            raise ValueError(
                f"kvzap needs its surrogate: run `{kvzap_surrogate.calibrate_command(self.surrogate_type, 'M')}`"
            )
        key = self.reconstruction_key
        observed = {i: o for i, o in enumerate(capture.observations) if o is not None}
        if not observed or all(key in o.reconstruction for o in observed.values()):
            return 0
        if any(o.latent for o in observed.values()):
            raise ValueError(
                "kvzap reads the attention input of full-rank layers: not on latent (MLA) models"
            )
        rows = surrogate_scores(model, ids, self.artifact, set(observed))
        for layer, obs in observed.items():
            obs.reconstruction[key] = rows[layer]
        return -(-len(ids) // SCORING_CHUNK)


def surrogate_scores(
    model: nn.Module, ids: list[int], surrogate: kvzap_surrogate.Surrogate, layers: set[int]
) -> dict[int, mx.array]:
    """{layer: [H_kv, T]}: the surrogate on every position's attention input, the context run in chunks through a
    fresh cache (only the scores are evaluated: the LM head never runs)."""
    pieces: dict[int, list[mx.array]] = {layer: [] for layer in layers}

    def seen(layer: int, x: mx.array) -> None:
        if layer in pieces:
            pieces[layer].append(surrogate.scores(layer, x))

    cache = make_prompt_cache(model)
    with attention_input.tapped(model, seen):
        for a in range(0, len(ids), SCORING_CHUNK):
            model(mx.array([ids[a : a + SCORING_CHUNK]]), cache=cache)
            mx.eval([c.state for c in cache], [p[-1] for p in pieces.values() if p])
    out = {layer: mx.concatenate(p, axis=1) for layer, p in pieces.items()}
    mx.eval(list(out.values()))
    return out
