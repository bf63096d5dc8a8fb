"""The positions NVIDIA kvpress 0.5.5 keeps, for `benchmarks.kvpress_parity` to compare KV Lens against.

Runs where PyTorch, transformers (< 5.3) and the kvpress wheel are installed (a GPU machine or a CPU venv; see
DESIGN.md); imports nothing of KV Lens. Input: the JSON `kvpress_parity --write-ids` writes (the demo model's token
ids of each prompt, per schedule). For every press and ratio it runs one pressed prefill and reads, per layer and
kv-head, which input positions the compressed cache still holds: a scorer press gathers rows of the dense keys, so
each kept row is matched to its nearest dense row; AdaKV masks instead of gathering, so its kept positions are the
complement of the `masked_key_indices` it records on each attention module.

    python benchmarks/kvpress_reference.py --ids ids.json --model resources/models/kvlens-demo --out kept.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path


def _stub_missing(*names: str) -> None:
    """kvpress imports these at module level for presses this script does not run."""
    import importlib.util

    for name in names:
        if importlib.util.find_spec(name) is None:
            module = types.ModuleType(name)
            module.load_dataset = None  # datasets
            module.LRUCache = dict  # cachetools
            module.cached = lambda *a, **k: lambda f: f
            sys.modules[name] = module


def _presses(kvpress):
    """KV Lens method name (`NAME?PARAM=VALUE&...` sets its parameters) -> (kvpress press factory, attention
    implementation it needs)."""
    return {
        "snapkv": (lambda: kvpress.SnapKVPress(window_size=64, kernel_size=5), "sdpa"),
        "streaming_llm": (lambda: kvpress.StreamingLLMPress(n_sink=4), "sdpa"),
        "knorm": (kvpress.KnormPress, "sdpa"),
        "tova": (kvpress.TOVAPress, "sdpa"),
        "h2o": (kvpress.ObservedAttentionPress, "eager"),
        "pyramidkv": (lambda: kvpress.PyramidKVPress(window_size=64, kernel_size=5), "sdpa"),
        "expected_attention": (kvpress.ExpectedAttentionPress, "sdpa"),
        "adakv": (lambda: kvpress.AdaKVPress(kvpress.SnapKVPress(window_size=64, kernel_size=5)), "sdpa"),
        "adakv-expected_attention": (lambda: kvpress.AdaKVPress(kvpress.ExpectedAttentionPress()), "sdpa"),
        "keydiff": (kvpress.KeyDiffPress, "sdpa"),
        "lagkv": (lambda: kvpress.LagKVPress(n_sink=4, lag_size=128), "sdpa"),
        "kvzip": (kvpress.KVzipPress, "sdpa"),
        "kvzip?layerwise=1": (lambda: kvpress.KVzipPress(layerwise=True), "sdpa"),
        "kvzip?kvzip_plus_normalization=1": (
            lambda: kvpress.KVzipPress(kvzip_plus_normalization=True),
            "sdpa",
        ),
        "kvzip?chunk_size=256": (lambda: kvpress.KVzipPress(chunk_size=256), "sdpa"),
        "merging": (
            lambda: kvpress.MergingPress(press=kvpress.SnapKVPress(window_size=64, kernel_size=5)),
            "sdpa",
        ),
        "think": (
            lambda: kvpress.ComposedPress(
                [kvpress.SnapKVPress(window_size=64, kernel_size=5), kvpress.ThinKPress(0.5, window_size=32)]
            ),
            "sdpa",
        ),
    }


def _layer_keys(cache, layer: int):
    return cache.layers[layer].keys if hasattr(cache, "layers") else cache.key_cache[layer]


def _layer_values(cache, layer: int):
    return cache.layers[layer].values if hasattr(cache, "layers") else cache.value_cache[layer]


def _kept(model, press, ids, torch, cache_cls, channels=None, value_sums=None) -> list[list[list[int]]]:
    """[layer][kv-head] sorted kept positions of one pressed prefill; `channels` (a list) gets [layer][kv-head]
    the key channels not zeroed (ThinK), `value_sums` [layer][kv-head] the sum of the kept values (merging)."""
    with torch.no_grad():
        dense = cache_cls()
        model.model(input_ids=ids, past_key_values=dense)
        pressed = cache_cls()
        with press(model):
            model.model(input_ids=ids, past_key_values=pressed)
    out = []
    for i, layer in enumerate(model.model.layers):
        ref = _layer_keys(dense, i)[0].float()  # [H, T, D]
        masked = getattr(layer.self_attn, "masked_key_indices", None)
        if masked is not None:  # AdaKV masks (batch, head, position) of the pruned pairs instead of gathering
            n_heads, n_tokens = ref.shape[:2]
            keep = torch.ones(n_heads, n_tokens, dtype=torch.bool, device=ref.device)
            keep[masked[1], masked[2]] = False
            out.append([torch.nonzero(keep[h]).flatten().tolist() for h in range(n_heads)])
            layer.self_attn.masked_key_indices = None
            continue
        kept = _layer_keys(pressed, i)[0].float()  # [H, n, D]
        if channels is not None:  # ThinK zeroed whole key channels: match rows on the others only
            stored = kept.abs().sum(dim=1) != 0  # [H, D]
            channels.append([torch.nonzero(stored[h]).flatten().tolist() for h in range(stored.shape[0])])
            ref = ref * stored[:, None, :]
        nearest = torch.cdist(kept, ref).argmin(dim=-1)  # [H, n]
        out.append([sorted(nearest[h].tolist()) for h in range(nearest.shape[0])])
        if value_sums is not None:  # merging rewrites kept values: their sum per head, [H][D]
            value_sums.append(_layer_values(pressed, i)[0].float().sum(dim=1).tolist())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ids", type=Path, required=True, help="kvpress_parity --write-ids output")
    p.add_argument(
        "--model", type=Path, required=True, help="the model folder (transformers LlamaForCausalLM)"
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--ratios", default="0.25,0.5", help="retention ratios r (kvpress compression_ratio = 1 - r)"
    )
    p.add_argument("--methods", default="", help="comma-separated subset of the methods (default: all)")
    args = p.parse_args(argv)
    _stub_missing("datasets", "fire", "cachetools")
    import kvpress
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache

    device = "cuda" if torch.cuda.is_available() else "cpu"
    prompts = json.loads(args.ids.read_text())
    ratios = [float(r) for r in args.ratios.split(",")]
    presses = _presses(kvpress)
    chosen = [m for m in (args.methods.split(",") if args.methods else presses) if m]
    models = {}
    result = {
        "kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else "0.5.5",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "kept": {},
    }
    start = time.perf_counter()
    for method in chosen:
        factory, attention = presses[method]
        if attention not in models:
            models[attention] = AutoModelForCausalLM.from_pretrained(
                args.model, torch_dtype=torch.float32, attn_implementation=attention
            ).to(device)
        model = models[attention]
        for prompt in prompts:
            for schedule, id_list in prompt["ids"].items():
                ids = torch.tensor([id_list], device=device)
                for ratio in ratios:
                    press = factory()
                    press.compression_ratio = 1.0 - ratio
                    if hasattr(press, "presses"):  # composed: the ratio is its position press's
                        press.presses[0].compression_ratio = 1.0 - ratio
                    key = f"{method}|{prompt['name']}|{schedule}|{ratio}"
                    channels = [] if method.startswith("think") else None
                    sums = [] if method.startswith("merging") else None
                    result["kept"][key] = _kept(model, press, ids, torch, DynamicCache, channels, sums)
                    if sums is not None:
                        result.setdefault("value_sums", {})[key] = sums
                    if channels is not None:
                        result.setdefault("channels", {})[key] = channels
        print(f"{method}: done ({time.perf_counter() - start:.1f} s)", flush=True)
    partial = args.out.with_name(
        f".{args.out.name}.partial"
    )  # torch's venv has no kvcore: temp file + rename
    partial.write_text(json.dumps(result))
    os.replace(partial, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
