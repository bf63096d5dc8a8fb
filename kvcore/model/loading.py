"""Find and load an mlx-lm model from a folder, the local Hugging Face cache, or (with a network) a repo id.

Every failure becomes a `ModelLoadError` whose message names the problem and the fix, so the GUI and the CLI
can show it in one line. `trust_remote_code` stays off: a model that needs custom code is refused.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from kvcore.model import attention, mla
from kvcore.model import checks as model_checks
from kvcore.model.prompting import has_chat_template

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelLoadError(ValueError):
    """The model could not be found or loaded; the message says why and what to do."""


@dataclass(frozen=True)
class ModelInfo:
    """Shapes a user (and the heatmap) needs; read from the config mlx-lm used."""

    name: str
    path: str
    model_type: str
    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    max_context: int | None
    vocab_size: int | None
    has_chat_template: bool = False  # the tokenizer's; prefill applies it by default, as mlx_lm.generate does
    attention_sinks: bool = False  # learned sinks (gpt_oss): mlx-lm's quantized attention cannot run them
    # MLA (kvcore.model.mla): the cache's one kv-head holds latent rows (head_dim = kv_lora_rank wide) as keys and their
    # RoPE key part (this wide) as values; observed queries and keys are head_dim + latent_rope_dim wide.
    latent_rope_dim: int = 0
    # Width of the cached values where it differs from head_dim (deepseek_v2: v_head_dim; MLA: the RoPE part).
    value_head_dim: int = 0
    #: The dense cache's element type ("float32" on MLX's CPU backend, "bfloat16" on a Mac): what "not quantized"
    #: stores, so the app names it instead of a bare "16".
    cache_dtype: str = ""

    @property
    def query_dim(self) -> int:
        """Width of the observed queries and keys: head_dim, plus the RoPE part for a latent model."""
        return self.head_dim + self.latent_rope_dim

    @property
    def value_dim(self) -> int:
        """Width of the cached values (quantization groups run along it as along head_dim for keys)."""
        return self.value_head_dim or self.head_dim


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache by huggingface_hub's rules, read now (its constants are fixed at import):
    HF_HUB_CACHE, the older HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub. An empty variable counts as unset; ~ and $VARS are expanded."""

    def env(name: str) -> Path | None:
        value = os.environ.get(name)
        return Path(os.path.expandvars(os.path.expanduser(value))) if value else None

    hub = env("HF_HUB_CACHE") or env("HUGGINGFACE_HUB_CACHE")
    if hub is not None:
        return hub
    home = env("HF_HOME") or (env("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return home / "hub"


def resolve(spec: str) -> Path:
    """A local folder for `spec`: the folder itself, or a snapshot in the local HF cache. No network here."""
    spec = str(spec).strip()
    if not spec:
        raise ModelLoadError("no model given: choose a model folder or a Hugging Face repo id")
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(
                f"{path} is a file, not a model folder: choose the folder that holds config.json"
            )
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{path} is not a model folder (no config.json): choose a folder with config.json, "
                "*.safetensors weights and tokenizer files"
            )
        if not any(path.glob("*.safetensors")):
            raise ModelLoadError(
                f"{path} has no *.safetensors weights: convert the model with mlx_lm.convert"
            )
        return path
    if not _REPO_ID.match(spec):
        raise ModelLoadError(f"{spec}: no such folder, and not a Hugging Face repo id like 'org/name'")
    snapshots = hf_cache_dir() / f"models--{spec.replace('/', '--')}" / "snapshots"
    found = (
        sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    )
    if found:
        return found[-1].parent
    return Path(spec)


def load(spec: str) -> tuple[nn.Module, Any, ModelInfo]:
    """Load model + tokenizer through `mlx_lm.load` and route its attention through kvcore."""
    import mlx_lm

    path = resolve(spec)
    config = None
    if path.exists():
        try:
            config = model_checks.check_config(path)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
    try:
        model, tokenizer, config = mlx_lm.load(
            str(path),
            tokenizer_config={"trust_remote_code": False},
            return_config=True,
            trust_remote_code=False,
        )
    except ModelLoadError:
        raise
    except Exception as exc:  # mlx-lm raises many kinds; all mean "this is not a loadable model"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not path.exists():
            raise ModelLoadError(
                f"{spec}: not in the local Hugging Face cache ({hf_cache_dir()}) and could not be downloaded "
                f"({first}); download it on a machine with a network, or choose a local folder"
            ) from exc
        explained = model_checks.explain_load_error(exc, path, config)
        if explained is not None:
            raise ModelLoadError(explained) from exc
        raise ModelLoadError(f"{path}: mlx-lm could not load this model: {first}") from exc
    if not path.exists():  # downloaded by repo id: the same refusals, now that its config is known
        try:
            model_checks.check_family(config, f"the config.json of {spec}")
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
    try:
        attention.install(model)
    except attention.UnsupportedArchitecture as exc:
        raise ModelLoadError(str(exc)) from exc
    upcast_on_cpu(model)
    info = dataclasses.replace(
        model_info(model, config, path),
        has_chat_template=has_chat_template(tokenizer),
        attention_sinks=model_checks.has_attention_sinks(model),
    )
    return model, tokenizer, info


def upcast_on_cpu(model: nn.Module) -> bool:
    """On MLX's CPU backend, run half-precision weights in float32; return whether it upcast.

    Half precision has no BLAS path there: a 1024-token prefill of the demo model takes 16-24 s in bfloat16
    against 2-3 s in float32. Quantized weights (uint32) are left alone; on a GPU nothing changes.
    """
    if mx.default_device().type != mx.DeviceType.cpu:
        return False
    halves = [v for _, v in tree_flatten(model.parameters()) if v.dtype in (mx.float16, mx.bfloat16)]
    if not halves:
        return False
    model.set_dtype(mx.float32, predicate=lambda dtype: dtype in (mx.float16, mx.bfloat16))
    mx.eval(model.parameters())
    return True


def model_info(model: nn.Module, config: dict, path: Path) -> ModelInfo:
    """Shapes from the config; kv-heads and widths from the cache a 1-token forward builds, where the model's
    first cache holds keys: configs can mislead (deepseek_v2 caches per-head keys qk_nope + qk_rope wide and
    values v_head_dim wide, neither hidden_size / num_attention_heads; MLA one latent kv-head of kv_lora_rank)."""
    text = config.get("text_config", config)
    n_layers = len(getattr(model, "layers", [])) or int(text.get("num_hidden_layers", 0))
    n_q = int(text.get("num_attention_heads", 0))
    n_kv = int(text.get("num_key_value_heads") or n_q)
    head_dim = int(text.get("head_dim") or (text.get("hidden_size", 0) // max(n_q, 1)))
    value_dim, cache_dtype = head_dim, ""
    cached = cached_shapes(model)
    if cached is not None:
        n_kv, head_dim, value_dim, cache_dtype = cached
    latent = mla.latent_dims(model)
    ctx = text.get("max_position_embeddings")
    name = path.name if path.exists() else str(path)
    return ModelInfo(
        name=name,
        path=str(path),
        model_type=str(config.get("model_type", "?")),
        n_layers=n_layers,
        n_q_heads=n_q,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        max_context=int(ctx) if ctx else None,
        vocab_size=text.get("vocab_size"),
        latent_rope_dim=latent[1] if latent is not None else 0,
        value_head_dim=value_dim if value_dim != head_dim else 0,
        cache_dtype=cache_dtype,
    )


def cached_shapes(model: nn.Module) -> tuple[int, int, int, str] | None:
    """(kv-heads, key width, value width, element type) of the first cache that holds keys after a 1-token
    forward, or None.

    Only the graph is built (shapes are known before evaluation), so nothing is computed."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    for layer in cache:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if isinstance(keys, mx.array) and isinstance(values, mx.array):
            return int(keys.shape[1]), int(keys.shape[-1]), int(values.shape[-1]), dtype_name(keys.dtype)
    return None


def dtype_name(dtype: mx.Dtype) -> str:
    """ "float32" for mx.float32: the name a CSV cell and a label show."""
    return str(dtype).rsplit(".", 1)[-1]
