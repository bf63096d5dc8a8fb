"""Refusals made before a model is prefilled, each one line naming the problem and the fix.

`check_config` reads config.json before any weight is loaded (no model_type, an unknown family, a multi-head
latent attention family other than deepseek_v3's, which KV Lens observes in latent space: kvcore.model.mla); `explain_load_error` turns mlx's parameter-mismatch errors, whose name lists the loader used to
cut off, into the first names and the count; `has_attention_sinks` tells the session that quantized KV is
impossible (mlx-lm's quantized attention raises "Quantized SDPA does not support attention sinks").
Free of MLX imports, so the GUI can word the same refusals.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mlx.nn as nn

#: Parameter names quoted in a mismatch message.
SHOWN_NAMES = 5
_MISMATCH = re.compile(r"^(Received (\d+) parameters not in model|Missing (\d+) parameters):\s*(.*)$", re.S)
_SIBLING = re.compile(r"^from \.(\w+) import", re.M)


def read_config(path: Path) -> dict[str, Any]:
    """config.json of a local model folder as a dict, or a one-line refusal."""
    file = path / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file} cannot be read ({exc}): check the file's permissions") from None
    except ValueError as exc:
        raise ValueError(f"{file} is not valid JSON ({exc}): restore it from the model's source") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file} is not a JSON object: restore it from the model's source")
    return config


def family(config: dict[str, Any]) -> str:
    """The mlx-lm module name a config's model_type maps to (mlx-lm's own remapping, e.g. kimi_k2 → deepseek_v3)."""
    from mlx_lm.utils import MODEL_REMAPPING

    model_type = str(config["model_type"])
    return MODEL_REMAPPING.get(model_type, model_type)


#: The mlx-lm module whose latent attention KV Lens observes (kvcore.model.mla); kimi_k2 and joyai_llm_flash map to it.
OBSERVED_LATENT_FAMILY = "deepseek_v3"


def _caches_latent(module_name: str) -> str | None:
    """The mlx-lm module whose attention caches a shared latent (MLA) for this family, or None.

    Read from the family's source and the mlx-lm modules it imports from (every latent-cache family in mlx-lm
    0.32 names the cached latent `kv_latent`), so a new MLA family is caught without a list to keep up to date.
    """
    seen, todo = set(), [module_name]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        spec = importlib.util.find_spec(f"mlx_lm.models.{name}")
        if spec is None or spec.origin is None:
            continue
        source = Path(spec.origin).read_text(encoding="utf-8")
        if "kv_latent" in source:
            return name
        todo.extend(m for m in _SIBLING.findall(source) if m not in ("base", "cache", "activations"))
    return None


def check_config(path: Path) -> dict[str, Any]:
    """Refuse, before any weight is read, a config KV Lens cannot run; return the config."""
    config = read_config(path)
    check_family(config, str(path / "config.json"))
    check_sizes(config, str(path / "config.json"))
    return config


#: Config sizes that must be positive whole numbers where given (mlx-lm asserts on some, crashes on others).
POSITIVE_SIZES: tuple[str, ...] = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
)


def check_sizes(config: dict[str, Any], file: str) -> None:
    """Refuse a size in config.json (top level or its text_config) that is not a positive whole number."""
    for part in (config, config.get("text_config")):
        if not isinstance(part, dict):
            continue
        for key in POSITIVE_SIZES:
            value = part.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{key} {value!r} in {file} is not a positive whole number: restore config.json from the "
                    "model's source"
                )


def check_family(config: dict[str, Any], file: str) -> None:
    """Refuse a config without model_type, of a family mlx-lm lacks, or with a latent (MLA) cache KV Lens
    cannot observe: only `OBSERVED_LATENT_FAMILY`'s own module is (another module's attention differs: an
    indexer, other cache lists, hybrid linear layers, another absorption)."""
    if not config.get("model_type"):
        raise ValueError(
            f'{file} has no \'model_type\': add the architecture\'s name, e.g. "model_type": "llama" '
            "(the config.json that came with the weights has it)"
        )
    name = family(config)
    if not name.isidentifier() or importlib.util.find_spec(f"mlx_lm.models.{name}") is None:
        raise ValueError(
            f"model_type {config['model_type']!r} in {file} is not an architecture mlx-lm knows: "
            "choose a model mlx-lm supports (llama, mistral, qwen3, gemma3, phi3, …) or upgrade mlx-lm"
        )
    latent = _caches_latent(name)
    if latent is not None and name != OBSERVED_LATENT_FAMILY:
        where = (
            f"computed by mlx-lm's {latent}.py, not by {OBSERVED_LATENT_FAMILY}'s attention"
            if latent != OBSERVED_LATENT_FAMILY
            else f"inside mlx-lm's {name}.py model, whose layers and caches differ from {OBSERVED_LATENT_FAMILY}'s"
        )
        raise ValueError(
            f"{config['model_type']} uses multi-head latent attention (MLA) {where}; {OBSERVED_LATENT_FAMILY}'s "
            "is the one MLA layout KV Lens observes in latent space, so this one cannot be scored correctly: "
            "choose deepseek_v3 / kimi_k2 or a model with standard attention (llama, qwen3, gemma3, gpt_oss, …)"
        )


def explain_load_error(exc: BaseException, path: Path, config: dict[str, Any] | None) -> str | None:
    """A one-line message for mlx's parameter mismatch errors (first names and the count), else None."""
    match = _MISMATCH.match(str(exc).strip())
    if match is None:
        return None
    names = [n.strip().rstrip(".") for n in match.group(4).split(",")]
    names = [n for n in names if n]
    count = int(match.group(2) or match.group(3))
    shown = ", ".join(names[:SHOWN_NAMES]) + (", …" if count > SHOWN_NAMES else "")
    file = path / "config.json"
    if match.group(2) is not None:  # the weights have parameters the model built from config.json lacks
        quantized = names and all(n.endswith((".scales", ".biases")) for n in names)
        if quantized and not (config or {}).get("quantization"):
            return (
                f"{path}: the weights are quantized ({count} parameters such as {shown}) but {file} has no "
                "'quantization' entry: add the one mlx_lm.convert wrote, e.g. "
                '"quantization": {"group_size": 64, "bits": 4}'
            )
        return (
            f"{path}: the weights do not match {file}: {count} parameters are not in the model it describes "
            f"({shown}); use the config.json that came with these weights"
        )
    return (
        f"{path}: the weights do not match {file}: {count} parameters of the model it describes are missing "
        f"({shown}); use the config.json that came with these weights, or re-convert with mlx_lm.convert"
    )


def latent_kv_refusal(model_type: str) -> str:
    """Why quantized KV is refused on a latent (MLA) model, and the fix."""
    return (
        f"{model_type} uses multi-head latent attention, which mlx-lm cannot run on a quantized KV cache (its "
        "attention multiplies the cached RoPE keys as a plain array, not packed ones): choose 16 bits "
        "(unquantized KV) for this model"
    )


def latent_query_stats_refusal(model_type: str, method: str) -> str:
    """Why expected_attention is refused on a latent (MLA) model, and the fix."""
    return (
        f"{method} needs pre-RoPE query statistics, but {model_type}'s multi-head latent attention applies RoPE "
        "to only part of each query and scores it in latent space, which expected_attention does not model: "
        "choose another method for this model"
    )


def quantized_kv_refusal(model_type: str, attention_sinks: bool, latent: bool) -> str | None:
    """Why this model cannot run on a quantized KV cache at all (sinks, latent attention), or None."""
    if attention_sinks:
        return sinks_refusal(model_type)
    return latent_kv_refusal(model_type) if latent else None


def has_attention_sinks(model: nn.Module) -> bool:
    """Whether any attention layer has learned sinks (gpt_oss), which mlx-lm's quantized attention refuses."""
    return any(getattr(m, "sinks", None) is not None for m in model.modules())


def sinks_refusal(model_type: str) -> str:
    """Why quantized KV is refused on a model with attention sinks, and the fix."""
    return (
        f"{model_type} has attention sinks, and mlx-lm's quantized attention does not support them "
        "('Quantized SDPA does not support attention sinks'): choose 16 bits (unquantized KV) for this model"
    )
