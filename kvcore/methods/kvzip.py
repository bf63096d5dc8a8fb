"""kvzip (Kim et al. 2025, "KVzip: query-agnostic KV cache compression with context reconstruction"), as kvpress's
KVzipPress defines it.

After the context is prefilled, the model reads "Repeat the previous context exactly." (the chat template's
assistant turn after it when the tokenizer has one) and then the context itself again, in chunks of `chunk_size`
tokens (later chunks are asked to start after the previous chunk's last 8 tokens). Each reconstruction query
attends over the first `n_sink` positions, the chunk being repeated and the reconstruction tokens before it (a
softmax over those keys only, as kvpress); a context pair's score is the largest weight any query of its kv-head's
group gives it. KVzip+ (`kvzip_plus_normalization`) divides each query's row by the norm of the attention input
and multiplies each column by ‖W_o·v‖ of that query head. Selection is global: the lowest scores across every
layer and kv-head are evicted (`layerwise`: the same count per layer, still spread over its heads); the first
`n_sink` positions are never evicted. With a chat template, the template's opening tokens before the context are
not reconstructed (they score 0), as kvpress, when the prompt went through the template.

Scores need a forward pass, so Session runs it (`reconstruct`) before ranking and caches the per-layer scores
in each observation; the stored cache stays the context's: the reconstruction rows are dropped after scoring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from kvcore.capture import reconstruction
from kvcore.capture.prefill import BLOCK_ELEMENTS, CaptureResult, LayerObservation
from kvcore.declared import param
from kvcore.methods.base import Method, n_sink_param
from kvcore.model import prompting

#: kvpress's reconstruction prompts (kvzip_press.py): the first chunk's, and the later chunks' (then 8 tokens).
FIRST_PROMPT = "\n\nRepeat the previous context exactly."
LATER_PROMPT = "\n\nRepeat the part of the previous context exactly, starting with"
PREVIOUS_TAIL = 8
KVZIP_CHUNK = 2048


def template_parts(tokenizer: Any) -> tuple[int, list[int]]:
    """(prefix length, suffix ids) of the chat template around a user turn, as kvpress reads them; (0, "\\n")'s
    ids without a template."""
    if not prompting.has_chat_template(tokenizer):
        return 0, list(tokenizer.encode("\n", add_special_tokens=False))
    dummy = "dummy context"
    separator = "\n" + "#" * len(dummy)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": dummy + separator}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,
    )
    context, suffix = text.split(separator)
    prefix = context.split(dummy)[0]
    prefix_ids = tokenizer.encode(prefix, add_special_tokens=False)
    return len(prefix_ids), list(tokenizer.encode(suffix, add_special_tokens=False))


def reconstruction_inputs(
    tokenizer: Any, ids: list[int], prefix_length: int, suffix: list[int], chunk_size: int
) -> list[tuple[int, int, list[int]]]:
    """(start, end, input ids) per chunk: the prompt, the template's suffix, then context[start:end]."""
    first_ids = list(tokenizer.encode(FIRST_PROMPT, add_special_tokens=False))
    later_ids = list(tokenizer.encode(LATER_PROMPT, add_special_tokens=False))
    out, previous = [], None
    for start in range(prefix_length, len(ids), chunk_size):
        chunk = ids[start : start + chunk_size]
        asked = first_ids if previous is None else later_ids + previous[-PREVIOUS_TAIL:]
        out.append((start, start + len(chunk), asked + suffix + chunk))
        previous = chunk
    return out


def _output_norms(attn: nn.Module, values: mx.array, n_kv_heads: int) -> mx.array:
    """‖W_o·v‖ per query head and position: [H_kv, group, T] (values [H_kv, T, D])."""
    o_proj = attn.get("o_proj") if isinstance(attn, nn.Module) else None
    if o_proj is None:
        raise ValueError("KVzip+ needs the attention's o_proj weight: set kvzip_plus_normalization=0")
    w = o_proj["weight"]
    if "scales" in o_proj:
        w = mx.dequantize(
            w, o_proj["scales"], o_proj.get("biases"), o_proj.group_size, o_proj.bits, mode=o_proj.mode
        )
    hidden, width = w.shape
    head_dim = values.shape[-1]
    group = width // head_dim // n_kv_heads
    w = w.astype(mx.float32).reshape(hidden, n_kv_heads, group, head_dim).transpose(1, 2, 3, 0)
    return mx.linalg.norm(values.astype(mx.float32)[:, None] @ w, axis=-1)


def chunk_scores(
    queries: mx.array,
    keys: mx.array,
    start: int,
    end: int,
    n_sink: int,
    scale: float,
    row_norms: mx.array | None = None,
    value_norms: mx.array | None = None,
) -> mx.array:
    """[H_kv, end - start]: the max attention the N reconstruction queries [H_q, N, D] give context keys start..end.

    keys [H_kv, T + N, D] are the context's then the reconstruction's. The softmax runs over the sinks before
    `start`, the chunk and the reconstruction keys (causal among those), as kvpress. KVzip+: `row_norms` [N],
    `value_norms` [H_kv, group, end - start]. Rows are independent, so queries go in blocks of at most
    BLOCK_ELEMENTS probabilities (a 2048-token chunk of a 32-head model would otherwise hold ~1 GiB per layer).
    """
    n_q_heads, n_new, head_dim = queries.shape
    n_kv_heads = keys.shape[0]
    group = n_q_heads // n_kv_heads
    sink = min(n_sink, start)
    k = mx.concatenate([keys[:, :sink], keys[:, start:end], keys[:, -n_new:]], axis=1).astype(mx.float32)
    k_t = k.transpose(0, 2, 1)[:, None]  # [H_kv, 1, D, sink + chunk + N]
    q = queries.astype(mx.float32).reshape(n_kv_heads, group, n_new, head_dim)
    n_ctx = sink + end - start
    block = max(1, BLOCK_ELEMENTS // (n_q_heads * (n_ctx + n_new)))
    best = None
    for a in range(0, n_new, block):
        b = min(a + block, n_new)
        logits = (q[:, :, a:b] @ k_t) * scale  # [H_kv, group, b - a, sink + chunk + N]
        causal = mx.arange(n_new)[None, :] <= mx.arange(a, b)[:, None]
        visible = mx.concatenate([mx.ones((b - a, n_ctx), mx.bool_), causal], axis=1)
        probs = mx.softmax(mx.where(visible, logits, -mx.inf), axis=-1, precise=True)[..., sink:n_ctx]
        if row_norms is not None:
            probs = probs / row_norms[a:b, None]
        if value_norms is not None:
            probs = probs * value_norms[:, :, None, :]
        found = probs.max(axis=(1, 2))
        best = found if best is None else mx.maximum(best, found)
        mx.async_eval(best)
    return best


@dataclass(frozen=True)
class KVzip(Method):
    name = "kvzip"
    description = (
        "KVzip (Kim et al. 2025): each pair's max attention while the model repeats the context; "
        "lowest evicted across layers and heads"
    )
    paper = (
        "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction (Kim et al. 2025), "
        "arXiv:2505.23416"
    )
    budget = "global"
    needs_reconstruction = True

    n_sink: int = n_sink_param()
    kvzip_plus_normalization: int = param(
        0, "KVzip+: rows over ‖input‖, columns times ‖W_o·v‖ (1 on, 0 off)", minimum=0, maximum=1
    )
    layerwise: int = param(
        0,
        "1: the same count evicted in every layer; 0: lowest scores across all layers",
        minimum=0,
        maximum=1,
    )
    chunk_size: int = param(KVZIP_CHUNK, "context tokens reconstructed by each replay pass", minimum=1)

    @property
    def reconstruction_key(self) -> tuple:
        """What the cached scores depend on (not `layerwise`: that is selection)."""
        return ("kvzip", self.n_sink, self.kvzip_plus_normalization, self.chunk_size)

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        found = obs.reconstruction.get(self.reconstruction_key)
        if found is None:
            raise ValueError(
                f"{self.name} scores come from a reconstruction pass: rank it through Session (which runs the pass)"
            )
        return found

    def always_kept(self, n_tokens: int) -> np.ndarray:
        return np.arange(min(self.n_sink, n_tokens), dtype=np.int64)

    def reconstruct(
        self, model: nn.Module, tokenizer: Any, capture: CaptureResult, ids: list[int], templated: bool
    ) -> int:
        """Run the reconstruction passes over `capture`'s cache (the context `ids`) and cache each layer's scores
        in its observation; returns the forward calls. `templated`: the prompt went through the chat template,
        whose opening tokens are then not reconstructed (kvpress's prefix)."""
        key = self.reconstruction_key
        observed = [o for o in capture.observations if o is not None]
        if not observed or all(key in o.reconstruction for o in observed):
            return 0
        if any(o.latent for o in observed):
            raise ValueError(
                f"{self.name} replays the context through full-rank attention: not on latent (MLA) models"
            )
        prefix_length, suffix = template_parts(tokenizer)
        prefix_length = prefix_length if templated else 0
        inputs = reconstruction_inputs(tokenizer, ids, prefix_length, suffix, self.chunk_size)
        n_tokens = len(ids)
        pieces: dict[int, list[mx.array]] = {}
        for start, end, input_ids in inputs:
            for layer, s in self.chunk_pass(model, capture.cache, start, end, input_ids).items():
                pieces.setdefault(layer, []).append(s)
        for layer, obs in enumerate(capture.observations):
            if obs is None:
                continue
            head = mx.zeros((obs.n_kv_heads, prefix_length), mx.float32)
            row = mx.concatenate([head, *pieces.get(layer, [])], axis=1)
            if row.shape[1] != n_tokens:
                raise ValueError(f"layer {layer} was not seen by the reconstruction pass")
            obs.reconstruction[key] = row
        mx.eval([o.reconstruction[key] for o in observed])
        return len(inputs)

    def chunk_pass(
        self, model: nn.Module, cache: list[Any], start: int, end: int, input_ids: list[int]
    ) -> dict[int, mx.array]:
        """Per layer, [H_kv, end - start]: the scores of context[start:end] from one replay of `input_ids`."""
        found: dict[int, mx.array] = {}
        plus = bool(self.kvzip_plus_normalization)
        modules = _attention_by_layer(model) if plus else {}

        def observe(layer, queries, keys, values, scale, row_norms) -> list[mx.array]:
            value_norms = None
            if plus:
                n_kv = keys.shape[1]
                value_norms = _output_norms(modules[layer], values[0, :, start:end], n_kv)
            found[layer] = chunk_scores(
                queries[0], keys[0], start, end, self.n_sink, scale, row_norms, value_norms
            )
            return [found[layer]]

        reconstruction.replay(model, cache, input_ids, observe, input_norms=plus)
        return found


def _attention_by_layer(model: nn.Module) -> dict[int, nn.Module]:
    """Layer index -> its attention module (mlx-lm's `layers[i].self_attn`)."""
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ValueError("KVzip+ needs the model's layers' self_attn modules: set kvzip_plus_normalization=0")
    return {i: layer.self_attn for i, layer in enumerate(layers) if hasattr(layer, "self_attn")}
