"""kvpress 0.5.5's DecodingPress / CompressionRatioDecodingPress on the ids KV Lens generated (torch side of
`kvpress_parity --decoding`; imported by kvpress_reference.py --decoding, imports nothing of KV Lens).

Per policy: the prompt is prefilled under the press (DecodingPress leaves the prefill alone), then the tokens KV Lens
fed are fed one at a time with their logical position_ids, as kvpress's pipeline generates. The position of every
stored row is followed exactly: a step appends the fed token's row; a compression gathers rows, so each row after it
is bit-for-bit one of the rows before it (or the row the step appended). (Matching rows to their nearest rows of a
dense cache, as an earlier version did, mislabels generated rows of layers above 0, whose keys depend on the
compressed context: knorm read 0.9905 that way and 0.9963 exactly.)
"""

from __future__ import annotations

from typing import Any


def press_for(kvpress: Any, policy: dict[str, Any]) -> Any:
    """The kvpress press matching a KV Lens DecodingPolicy's arguments."""
    method, window = policy["method"], policy.get("window", 64)
    base = {
        "snapkv": lambda: kvpress.SnapKVPress(window_size=window, kernel_size=5),
        "knorm": kvpress.KnormPress,
        "tova": kvpress.TOVAPress,
    }[method]()
    interval = policy["interval"]
    if "ratio" in policy:
        return kvpress.CompressionRatioDecodingPress(
            base_press=base, target_compression_ratio=1.0 - policy["ratio"], compression_interval=interval
        )
    return kvpress.DecodingPress(base_press=base, compression_interval=interval, target_size=policy["budget"])


def _layer_keys(cache: Any, layer: int) -> Any:
    return cache.layers[layer].keys if hasattr(cache, "layers") else cache.key_cache[layer]


def _follow(before: Any, positions: Any, after: Any, position: int, torch: Any) -> Any:
    """Positions [H, n] of the rows `after` [H, n, D], given the rows `before` [H, m, D] held before the step with
    their positions [H, m] and the position of the row the step appended."""
    grown = after.shape[1] == before.shape[1] + 1 and torch.equal(after[:, :-1], before)
    if grown:  # no compression: the step's row appended
        return torch.cat([positions, torch.full_like(positions[:, :1], position)], dim=1)
    same = (after[:, :, None, :] == before[:, None, :, :]).all(dim=-1)  # [H, n, m]
    if int(same.sum(dim=-1).max()) > 1:
        raise ValueError("two stored rows are identical: positions cannot be told apart")
    found = same.any(dim=-1)
    index = same.float().argmax(dim=-1)
    return torch.where(found, torch.gather(positions, 1, index), torch.full_like(index, position))


def _recording_scores(press: Any, scored: dict[int, Any], inputs: dict[int, Any] | None = None) -> None:
    """Keep, per layer, the scores the base press gives the rows it is about to compress (in stored order); with
    `inputs`, also what it scored them from: the keys [H_kv, n, D] in stored order and the buffered hidden states
    [n_buffer, hidden] (NumPy, for a same-state replay in KV Lens)."""
    score = press.base_press.score

    def recorded(module: Any, hidden: Any, keys: Any, *args: Any, **kwargs: Any) -> Any:
        out = score(module, hidden, keys, *args, **kwargs)
        scored[module.layer_idx] = out[0].float().clone()
        if inputs is not None:
            inputs[module.layer_idx] = (keys[0].float().numpy().copy(), hidden[0].float().numpy().copy())
        return out

    press.base_press.score = recorded


def run(
    model: Any,
    entries: list[dict[str, Any]],
    kvpress: Any,
    torch: Any,
    cache_cls: Any,
    detail: dict[str, Any] | None = None,
    states: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """policy name -> {step: [layer][kv_head] kept positions} after each compression. detail (filled when given):
    policy name -> {step: {"held": [layer][kv_head] positions before the compression in stored order, "scores":
    the press's score of each, "order": the kept positions in stored order}}. states (filled when given):
    "policy/step/layer/keys" and ".../hidden" -> what the press scored (`_recording_scores`)."""
    out: dict[str, Any] = {}
    n_layers = len(model.model.layers)
    for entry in entries:
        prompt, fed = entry["prompt"], entry["fed"]
        with torch.no_grad():
            cache, kept, steps, scored, inputs = cache_cls(), {}, {}, {}, {}
            press = press_for(kvpress, entry["policy"])
            _recording_scores(press, scored, inputs if states is not None else None)
            with press(model):
                model(input_ids=torch.tensor([prompt]), past_key_values=cache, logits_to_keep=1)
                rows = [_layer_keys(cache, i)[0].clone() for i in range(n_layers)]
                positions = [torch.arange(len(prompt)).repeat(r.shape[0], 1) for r in rows]
                for i, token in enumerate(fed):
                    position = len(prompt) + i
                    scored.clear()
                    inputs.clear()
                    model(
                        input_ids=torch.tensor([[token]]),
                        past_key_values=cache,
                        position_ids=torch.tensor([[position]]),
                        logits_to_keep=1,
                    )
                    held = [torch.cat([p, torch.full_like(p[:, :1], position)], dim=1) for p in positions]
                    for layer in range(n_layers):
                        after = _layer_keys(cache, layer)[0].clone()
                        positions[layer] = _follow(rows[layer], positions[layer], after, position, torch)
                        rows[layer] = after
                    if scored:  # compressed at this step (i + 1 tokens fed)
                        kept[str(i + 1)] = [
                            [sorted(p[h].tolist()) for h in range(p.shape[0])] for p in positions
                        ]
                        steps[str(i + 1)] = {
                            "held": [h.tolist() for h in held],
                            "scores": [
                                scored[layer].tolist() if layer in scored else None
                                for layer in range(n_layers)
                            ],
                            "order": [p.tolist() for p in positions],
                        }
                        for layer, (keys, hidden) in inputs.items() if states is not None else ():
                            states[f"{entry['name']}/{i + 1}/{layer}/keys"] = keys
                            states[f"{entry['name']}/{i + 1}/{layer}/hidden"] = hidden
        out[entry["name"]] = kept
        if detail is not None:
            detail[entry["name"]] = steps
        print(f"{entry['name']}: {len(kept)} compressions", flush=True)
    return out
