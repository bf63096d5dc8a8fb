"""kvpress 0.5.5's DecodingPress / CompressionRatioDecodingPress on the ids KV Lens generated (torch side of
`kvpress_parity --decoding`; imported by kvpress_reference.py --decoding, imports nothing of KV Lens).

Per policy: the prompt is prefilled under the press (DecodingPress leaves the prefill alone), then the tokens KV Lens
fed are fed one at a time with their logical position_ids, as kvpress's pipeline generates. After each step whose
cache shrank, each layer's kept rows are matched to their nearest rows of a dense cache of the same sequence.
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


def run(
    model: Any, entries: list[dict[str, Any]], kvpress: Any, torch: Any, cache_cls: Any
) -> dict[str, Any]:
    """policy name -> {step: [layer][kv_head] kept positions} after each compression."""
    out: dict[str, Any] = {}
    for entry in entries:
        prompt, fed = entry["prompt"], entry["fed"]
        with torch.no_grad():
            dense = cache_cls()
            model.model(input_ids=torch.tensor([prompt + fed]), past_key_values=dense)
            refs = [_layer_keys(dense, i)[0].float() for i in range(len(model.model.layers))]
            cache, kept = cache_cls(), {}
            press = press_for(kvpress, entry["policy"])
            with press(model):
                model(input_ids=torch.tensor([prompt]), past_key_values=cache, logits_to_keep=1)
                length = len(prompt)
                for i, token in enumerate(fed):
                    position = torch.tensor([[len(prompt) + i]])
                    model(
                        input_ids=torch.tensor([[token]]),
                        past_key_values=cache,
                        position_ids=position,
                        logits_to_keep=1,
                    )
                    now = _layer_keys(cache, 0).shape[2]
                    if now < length + 1:  # compressed at this step (i + 1 tokens fed)
                        seen = len(prompt) + i + 1
                        layers = []
                        for layer, ref in enumerate(refs):
                            rows = _layer_keys(cache, layer)[0].float()
                            nearest = torch.cdist(rows, ref[:, :seen]).argmin(dim=-1)
                            layers.append([sorted(nearest[h].tolist()) for h in range(nearest.shape[0])])
                        kept[str(i + 1)] = layers
                    length = now
        out[entry["name"]] = kept
        print(f"{entry['name']}: {len(kept)} compressions", flush=True)
    return out
