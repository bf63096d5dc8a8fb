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


def _snapkv(kvpress):
    return kvpress.SnapKVPress(window_size=64, kernel_size=5)


FINCH_WINDOW = 64  # KV Lens's finch window (its default, kvcore.defaults.DEFAULT_WINDOW)


def layer_ratios(ratio: float, n_layers: int) -> list[float]:
    """per_layer_compression's parity setting: from r/2 in the first layer to 3r/2 in the last (mean r); the same
    rule is in kvpress_parity.py (this script imports nothing of KV Lens)."""
    return [ratio * (0.5 + layer / (n_layers - 1)) for layer in range(n_layers)]


def _lukv(kvpress):
    """LUKVPress over its default ExpectedAttentionPress(epsilon=2e-2), with the parity curve instead of a download:
    at compression c the (layer, head) slots prune c·(0.5 + s/(L·H − 1)), at most 0.99 (kvpress_parity.lukv_curve)."""
    import numpy as np

    class ParityLUKV(kvpress.LUKVPress):
        def _load_budget_curves(self, model):
            n_layers, n_heads = self._model_curve_shape(model)
            slots = np.arange(n_layers * n_heads) / (n_layers * n_heads - 1)
            c = np.arange(1, 100)[:, None] / 100
            return np.minimum(0.99, c * (0.5 + slots[None])).reshape(99, n_layers, n_heads)

    return ParityLUKV()


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
        "leverage": (kvpress.LeverageScorePress, "sdpa"),
        "cur": (kvpress.CURPress, "sdpa"),
        "non_causal_attention": (kvpress.NonCausalAttnPress, "sdpa"),
        "compactor": (kvpress.CompactorPress, "sdpa"),
        "cap": (kvpress.CapPress, "sdpa"),
        # wrappers (KV Lens names WRAPPER-INNER; bare = the default inner); parameters as kvpress_parity.PARAMS
        "chunkkv": (lambda: kvpress.ChunkKVPress(_snapkv(kvpress), chunk_length=20), "sdpa"),
        "criticalkv": (lambda: kvpress.CriticalKVPress(_snapkv(kvpress)), "sdpa"),
        "critical_adakv": (lambda: kvpress.CriticalAdaKVPress(_snapkv(kvpress)), "sdpa"),
        "chunk-keydiff": (lambda: kvpress.ChunkPress(kvpress.KeyDiffPress(), chunk_length=256), "sdpa"),
        "block": (lambda: kvpress.BlockPress(kvpress.KeyDiffPress(), block_size=128), "sdpa"),
        "per_layer_compression": (lambda: kvpress.PerLayerCompressionPress(_snapkv(kvpress), [0.0]), "sdpa"),
        "snapkv+knorm": (lambda: kvpress.ComposedPress([_snapkv(kvpress), kvpress.KnormPress()]), "sdpa"),
        "key_rerotation": (lambda: kvpress.KeyRerotationPress(_snapkv(kvpress)), "sdpa"),
        "simlayerkv": (lambda: kvpress.SimLayerKVPress(lazy_threshold=0.6, n_recent=256), "sdpa"),
        "dms": (lambda: kvpress.DMSPress(_snapkv(kvpress), threshold=0.001), "sdpa"),
        # finch reads its window from a delimiter token, added to a model of its own (FINCH_WINDOW before the end)
        "finch": (kvpress.FinchPress, "sdpa+delimiter"),
        "duo_attention": (lambda: _duo_on_prompt(kvpress), "sdpa"),
        "expected_attention_stats": (lambda: _stats_from_artifact(kvpress), "sdpa"),
        "qfilter": (lambda: _qfilter_from_artifact(kvpress), "sdpa"),
        "duo_attention_calibrated": (lambda: _duo_on_prompt(kvpress, calibration=True), "sdpa"),
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
        # presses_more: entropy_gated_chunkkv, lukv, kvcompose
        "entropy_gated_chunkkv": (lambda: kvpress.EntropyGatedChunkKVPress(_snapkv(kvpress)), "sdpa"),
        "lukv": (lambda: _lukv(kvpress), "sdpa"),
        # kvcompose re-reads the context after it (eager attention); NAME@VARIANT: kvpress_parity.PARAMS's setting
        "kvcompose": (kvpress.KVComposePress, "eager"),
        "kvcompose@unstructured": (lambda: kvpress.KVComposePress(structured=False), "eager"),
        # presses_kvgrad: input x gradient through the reconstruction replay (one backward pass per chunk)
        "kvgrad": (kvpress.KVgradPress, "sdpa"),
        "kvgrad?layerwise=1": (lambda: kvpress.KVgradPress(layerwise=True), "sdpa"),
        "kvgrad?chunk_size=256": (lambda: kvpress.KVgradPress(chunk_size=256), "sdpa"),
        # presses_kvzap: KVzapPress on KV Lens's trained surrogate, alone and under DMSPress (its intended pairing)
        "kvzap": (lambda: _kvzap_from_artifact(kvpress), "sdpa"),
        "kvzap?model_type=1": (lambda: _kvzap_from_artifact(kvpress, "linear"), "sdpa"),
        "dms-kvzap": (
            lambda: kvpress.DMSPress(_kvzap_from_artifact(kvpress), threshold=KVZAP_THRESHOLD),
            "sdpa",
        ),
    }


#: dms-kvzap's parity threshold on the surrogate's log-score (kvpress_parity.PARAMS gives KV Lens the same).
KVZAP_THRESHOLD = -6.0


def _kvzap_from_artifact(kvpress, model_type: str = "mlp"):
    """KVzapPress given KV Lens's trained surrogate (`kvlens calibrate kvzap`, in $KVLENS_DATA_DIR) as kvpress's own
    KVzapModel (kvpress downloads nvidia/KVzap-* for a few models): its weights are stored in nn.Linear's layout."""
    import torch

    arrays, header = _artifact(f"kvzap-{model_type}", f"kvzap --kvzap-type {model_type}")
    arrays = {k: v.float() for k, v in arrays.items()}
    module = sys.modules[kvpress.KVzapPress.__module__]
    layers = header["layers"]
    config = module.KVzapConfig(
        input_dim=header["input_dim"],
        output_dim=header["output_dim"],
        n_modules=len(layers),
        hidden_dim=header["hidden_dim"] if model_type == "mlp" else None,
    )
    surrogate = module.KVzapModel(config)
    names = {"w1": "0.weight", "b1": "0.bias", "w2": "2.weight", "b2": "2.bias", "w": "weight", "b": "bias"}
    state = {}
    for slot, layer in enumerate(layers):
        for ours, theirs in names.items():
            if f"layer{layer}.{ours}" in arrays:
                state[f"layers.{slot}.{theirs}"] = arrays[f"layer{layer}.{ours}"]
    surrogate.load_state_dict(state)
    surrogate.eval()

    class GivenSurrogate(kvpress.KVzapPress):
        def post_init_from_model(self, model):
            self.kvzap_model = surrogate

    with torch.no_grad():
        return GivenSurrogate(model_type=model_type)


def _artifact(stem: str, command: str | None = None):
    """KV Lens's calibration artifact `stem-<fingerprint>.safetensors` (made by `kvlens calibrate COMMAND`, the
    stem by default) in $KVLENS_DATA_DIR: (float64 arrays, header)."""
    import glob

    from safetensors import safe_open

    folder = os.environ.get("KVLENS_DATA_DIR")
    found = sorted(glob.glob(os.path.join(folder or ".", f"{stem}-*.safetensors")))
    if not folder or len(found) != 1:
        raise SystemExit(
            f"{stem}: set KVLENS_DATA_DIR to the folder holding one `kvlens calibrate {command or stem}` file"
        )
    with safe_open(found[0], "pt") as f:
        header = json.loads(f.metadata()["kvlens"])
        return {k: f.get_tensor(k).double() for k in f.keys()}, header  # noqa: SIM118 (safe_open)


def _stats_from_artifact(kvpress):
    """ExpectedAttentionStatsPress given KV Lens's calibrated query mean and unbiased covariance (kvpress reads
    them from the Hub for a few models)."""
    import torch

    arrays, header = _artifact("expected_attention_stats")
    counts = header["counts"]
    press = kvpress.ExpectedAttentionStatsPress()
    press.mu = torch.stack([arrays[f"layer{i}.mean"] for i in range(len(counts))]).float()
    press.cov = torch.stack([arrays[f"layer{i}.m2"] / (n - 1) for i, n in enumerate(counts)]).float()
    return press


def _qfilter_from_artifact(kvpress):
    """QFilterPress given filters from KV Lens's calibration statistics (the principal direction of each kv-head's
    pre-RoPE queries, signed by the mean query): kvpress's own scoring, −⟨filter, cached key⟩, then runs on them."""
    import torch

    arrays, header = _artifact("qfilter")

    def filters(n_kv_heads: int):
        out = []
        for i, n in enumerate(header["counts"]):
            mean, m2 = arrays[f"layer{i}.mean"], arrays[f"layer{i}.m2"]  # [H_q, D], [H_q, D, D]
            second = m2 + n * mean[:, :, None] * mean[:, None, :]
            second = second.reshape(n_kv_heads, -1, *second.shape[1:]).sum(1)
            vectors = torch.linalg.eigh(second).eigenvectors[..., -1]  # [H_kv, D]
            sign = torch.sign((vectors * mean.reshape(n_kv_heads, -1, mean.shape[-1]).mean(1)).sum(-1))
            out.append(vectors * sign[:, None])
        return torch.stack(out)

    class GivenFilters(kvpress.QFilterPress):
        def post_init_from_model(self, model):
            self.q_filters = filters(model.config.num_key_value_heads).to(model.dtype)

    return GivenFilters()


#: The ids of the prompt being pressed (main sets them), and the samples duo_attention's on-the-fly scoring reads.
_prompt = types.SimpleNamespace(ids=None, samples=None)


class _PromptSample:
    """Stands for BookSum in kvpress's duo_attention_press: the "chapters" are `_prompt.samples` (token ids)."""

    def to_pandas(self):
        return self

    def sample(self, n, random_state=None):
        return {"chapter": types.SimpleNamespace(tolist=lambda: list(_prompt.samples))}


class _IdsTokenizer:
    """Stands for AutoTokenizer there: a "text" is already the prompt's ids."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        return cls()

    def __call__(self, ids, return_tensors=None):
        import torch
        from transformers import BatchEncoding

        return BatchEncoding({"input_ids": torch.tensor([ids], device=_prompt.ids.device)})


def _calibration_samples(model) -> list[list[int]]:
    """The calibration prompts' ids (the .txt files of $KVLENS_CALIBRATION_PROMPTS, default resources/prompts, as
    `kvlens calibrate duo_attention_calibrated --prompts` read them), by the model's own tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model.config.name_or_path)
    folder = Path(os.environ.get("KVLENS_CALIBRATION_PROMPTS", "resources/prompts"))
    return [tokenizer(f.read_text())["input_ids"] for f in sorted(folder.glob("*.txt"))]


def _duo_on_prompt(kvpress, calibration: bool = False):
    """kvpress's DuoAttentionPress with on_the_fly_scoring, its head scores computed on the pressed prompt (one
    sample, uncached) instead of 50 BookSum chapters, as KV Lens scores them — or, `calibration`, on the
    calibration prompts (duo_attention_calibrated); the run's compression ratio is its head_compression_ratio (the
    share of streaming heads), which the press takes instead of a compression ratio."""
    module = sys.modules[kvpress.DuoAttentionPress.__module__]
    if not hasattr(module, "_kvlens_original"):
        original = module.duo_attention_on_the_fly
        module._kvlens_original = getattr(original, "__wrapped__", original)
        module.duo_attention_on_the_fly = lambda model: module._kvlens_original(
            model, num_samples=len(_prompt.samples)
        )
        module.load_dataset = lambda *args, **kwargs: _PromptSample()
        module.AutoTokenizer = _IdsTokenizer

    class DuoOnPrompt(kvpress.DuoAttentionPress):
        @property
        def compression_ratio(self):
            return self.compression_ratio_

        @compression_ratio.setter
        def compression_ratio(self, value):
            self.head_compression_ratio = value

        def post_init_from_model(self, model):
            _prompt.samples = _calibration_samples(model) if calibration else [_prompt.ids[0].tolist()]
            super().post_init_from_model(model)

    return DuoOnPrompt(on_the_fly_scoring=True)


class _SketchTorch(types.ModuleType):
    """Stands for `torch` inside kvpress's leverage_press: every name is torch's but `randn`, which returns KV Lens's
    sketch of the layer being scored (kvcore.methods.leverage.sketch: NumPy's generator seeded by (seed, layer)),
    so the leverage of both sides is computed from the same matrix."""

    def __init__(self, torch, seed: int) -> None:
        super().__init__("torch")
        self._torch, self._seed, self.layer = torch, seed, 0

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def randn(self, *shape, device=None, dtype=None):
        import numpy as np

        *_, n_heads, head_dim, width = shape
        rng = np.random.default_rng([self._seed, self.layer])
        phi = rng.standard_normal((n_heads, head_dim, width)).astype(
            np.float32
        )  # kvpress scales it by 1/√width
        return self._torch.tensor(phi, device=device).to(dtype).expand(*shape)


def _use_numpy_sketch(kvpress, torch, seed: int) -> None:
    """Make LeverageScorePress (and CompactorPress through it) draw KV Lens's sketch instead of torch's."""
    module = sys.modules[kvpress.LeverageScorePress.__module__]
    stand_in = _SketchTorch(torch, seed)
    module.torch = stand_in
    score = kvpress.LeverageScorePress.score

    def score_with_layer(self, module, *args, **kwargs):
        stand_in.layer = module.layer_idx
        return score(self, module, *args, **kwargs)

    kvpress.LeverageScorePress.score = score_with_layer


def _layer_keys(cache, layer: int):
    return cache.layers[layer].keys if hasattr(cache, "layers") else cache.key_cache[layer]


def _record_rerotated(kvpress) -> None:
    """Re-rotated keys no longer match their dense rows (and in layer 0 a repeated token's copies are identical
    up to RoPE), so the positions kvpress re-rotates are read where it passes them: `rerotate_keys`'s indices,
    kept on the attention module (key_rerotation, finch)."""
    original = kvpress.KeyRerotationPress.rerotate_keys

    def recording(module, indices, keys):
        module.kvlens_rerotated = indices[0].tolist()
        return original(module, indices, keys)

    kvpress.KeyRerotationPress.rerotate_keys = staticmethod(recording)


def _layer_values(cache, layer: int):
    return cache.layers[layer].values if hasattr(cache, "layers") else cache.value_cache[layer]


def _kept(
    model, press, ids, torch, cache_cls, pressed_ids=None, channels=None, value_sums=None
) -> list[list[list[int]]]:
    """[layer][kv-head] sorted kept positions of one pressed prefill (pressed_ids: the pressed run's input,
    finch's with its delimiter); `channels` (a list) gets [layer][kv-head] the key channels not zeroed (ThinK),
    `value_sums` [layer][kv-head] the sum of the kept values (merging)."""
    with torch.no_grad():
        dense = cache_cls()
        model.model(input_ids=ids, past_key_values=dense)
        pressed = cache_cls()
        with press(model):
            model.model(input_ids=ids if pressed_ids is None else pressed_ids, past_key_values=pressed)
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
        rerotated = getattr(layer.self_attn, "kvlens_rerotated", None)
        if rerotated is not None:
            out.append([sorted(h) for h in rerotated])
            layer.self_attn.kvlens_rerotated = None
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
    p.add_argument(
        "--sketch",
        choices=("numpy", "torch"),
        default="numpy",
        help="leverage's Gaussian sketch: KV Lens's (seed 0) or torch's own random draw",
    )
    p.add_argument(
        "--decoding",
        action="store_true",
        help="--ids is `kvpress_parity --decoding --write-ids` output: run DecodingPress on its generated ids",
    )
    p.add_argument(
        "--states",
        type=Path,
        help="with --decoding: also write what the press scored at each compression (keys, buffered hidden states) "
        "to this .npz, for `kvpress_parity --decoding --replay`",
    )
    args = p.parse_args(argv)
    _stub_missing("datasets", "fire", "cachetools")
    import kvpress
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.sketch == "numpy":
        _use_numpy_sketch(kvpress, torch, seed=0)
    prompts = json.loads(args.ids.read_text())
    ratios = [float(r) for r in args.ratios.split(",")]
    presses = _presses(kvpress)
    _record_rerotated(kvpress)
    chosen = [m for m in (args.methods.split(",") if args.methods else presses) if m]
    models = {}
    result = {
        "kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else "0.5.5",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "sketch": args.sketch,
        "kept": {},
    }
    start = time.perf_counter()
    if args.decoding:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import kvpress_decoding_reference

        model = AutoModelForCausalLM.from_pretrained(
            args.model, torch_dtype=torch.float32, attn_implementation="sdpa"
        ).to(device)
        entries = [e for e in prompts if not args.methods or e["name"] in args.methods.split(",")]
        states: dict | None = {} if args.states else None
        for entry in entries:  # written after each policy: a long CPU run keeps what it finished
            result["kept"].update(
                kvpress_decoding_reference.run(
                    model, [entry], kvpress, torch, DynamicCache, result.setdefault("detail", {}), states
                )
            )
            _write(args.out, result)
        if states is not None:
            import numpy as np

            np.savez_compressed(args.states, **states)
        return 0
    for method in chosen:
        factory, attention = presses[method]
        if attention not in models:
            models[attention] = AutoModelForCausalLM.from_pretrained(
                args.model, torch_dtype=torch.float32, attn_implementation=attention.split("+")[0]
            ).to(device)
            if attention.endswith("+delimiter"):  # one new token id, dropped from the input by finch's hook
                models[attention].resize_token_embeddings(models[attention].config.vocab_size + 1)
        model = models[attention]
        for prompt in prompts:
            for schedule, id_list in prompt["ids"].items():
                ids = torch.tensor([id_list], device=device)
                _prompt.ids = ids
                for ratio in ratios:
                    press = factory()
                    if isinstance(press, kvpress.PerLayerCompressionPress):
                        n_layers = model.config.num_hidden_layers
                        press.compression_ratios = [1.0 - r for r in layer_ratios(ratio, n_layers)]
                    elif isinstance(press, kvpress.ComposedPress) and isinstance(
                        press.presses[-1], kvpress.ThinKPress
                    ):  # think: positions from the first press alone, ThinK's ratio is its channels'
                        press.presses[0].compression_ratio = 1.0 - ratio
                    elif isinstance(
                        press, kvpress.ComposedPress
                    ):  # each stage keeps r^(1/k), as KV Lens's chain
                        for stage in press.presses:
                            stage.compression_ratio = 1.0 - ratio ** (1 / len(press.presses))
                    elif not isinstance(
                        press, (kvpress.SimLayerKVPress, kvpress.DMSPress)
                    ):  # they set their own
                        press.compression_ratio = 1.0 - ratio
                    key = f"{method}|{prompt['name']}|{schedule}|{ratio}"
                    pressed_ids = None
                    if isinstance(press, kvpress.FinchPress):
                        press.delimiter_token_id = model.config.vocab_size - 1
                        cut = len(id_list) - FINCH_WINDOW
                        pressed_ids = torch.tensor(
                            [[*id_list[:cut], press.delimiter_token_id, *id_list[cut:]]]
                        )
                    channels = [] if method.startswith("think") else None
                    sums = [] if method.startswith("merging") else None
                    result["kept"][key] = _kept(
                        model, press, ids, torch, DynamicCache, pressed_ids, channels, sums
                    )
                    if sums is not None:
                        result.setdefault("value_sums", {})[key] = sums
                    if channels is not None:
                        result.setdefault("channels", {})[key] = channels
        print(f"{method}: done ({time.perf_counter() - start:.1f} s)", flush=True)
    _write(args.out, result)
    return 0


def _write(out: Path, result: dict) -> None:
    partial = out.with_name(f".{out.name}.partial")  # torch's venv has no kvcore: temp file + rename
    partial.write_text(json.dumps(result))
    os.replace(partial, out)


if __name__ == "__main__":
    sys.exit(main())
