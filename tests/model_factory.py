"""Build real mlx-lm models with small random weights, written to a folder and loaded via mlx_lm.load.

Nothing here is a mock: the architecture classes are mlx-lm's own, the tokenizer is a real byte-level BPE
trained with `tokenizers`, and loading goes through the same `mlx_lm.load` path a user's model does.
"""

from __future__ import annotations

import json
from pathlib import Path

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)

# isort: split
import mlx.core as mx
from mlx.utils import tree_flatten

ARCHS = {
    "llama": dict(
        model_type="llama",
        hidden_size=128,
        num_hidden_layers=4,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    ),
    "qwen3": dict(
        model_type="qwen3",
        hidden_size=128,
        num_hidden_layers=3,
        intermediate_size=256,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    ),
    # Attention sinks and alternating sliding-window (RotatingKVCache) / full layers.
    "gpt_oss": dict(
        model_type="gpt_oss",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        rms_norm_eps=1e-5,
        rope_theta=150000,
        max_position_embeddings=4096,
    ),
    # Sliding-window layers (every layer but each sliding_window_pattern-th is a RotatingKVCache).
    "gemma3_text": dict(
        model_type="gemma3_text",
        hidden_size=128,
        num_hidden_layers=3,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=16,
        sliding_window_pattern=3,
        max_position_embeddings=4096,
    ),
    # Multi-head latent attention (kv_lora_rank != qk_nope_head_dim): one shared latent per token in the cache.
    "deepseek_v3": dict(
        model_type="deepseek_v3",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=2,
        n_shared_experts=1,
        num_experts_per_tok=1,
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=16,
        v_head_dim=16,
        qk_nope_head_dim=16,
        first_k_dense_replace=1,
        max_position_embeddings=4096,
    ),
    # Real architecture whose attention is computed by hand (softcapping), not through mlx-lm's shared
    # function: KV Lens must refuse it with a clear message.
    "gemma2": dict(
        model_type="gemma2",
        hidden_size=128,
        num_hidden_layers=2,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rms_norm_eps=1e-6,
        query_pre_attn_scalar=32,
    ),
}

# MLA whose mlx-lm module expands the latent into per-head keys (qk_nope + qk_rope = 64 wide) and values
# (v_head_dim 32) in a plain KVCache: neither width is hidden_size / num_attention_heads (16).
ARCHS["deepseek_v2"] = dict(
    ARCHS["deepseek_v3"],
    model_type="deepseek_v2",
    v_head_dim=32,
    qk_nope_head_dim=48,
    rope_scaling={"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096},
)

_CORPUS = (
    "def main(argv):\n    return sum(x * x for x in argv)\n"
    "The quick brown fox jumps over the lazy dog. KV caches keep keys and values.\n"
    "class Cache:\n    def update(self, keys, values):\n        self.keys = keys\n"
) * 20


def write_tokenizer(folder: Path, vocab_size: int = 512) -> int:
    """Train a tiny byte-level BPE and write it in the Hugging Face layout; return its vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([_CORPUS], trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|endoftext|>",
                "bos_token": None,
                "model_max_length": 4096,
            }
        )
    )
    return tok.get_vocab_size()


def build_model(
    folder: Path, arch: str = "llama", seed: int = 0, dtype: str = "float32", **overrides
) -> Path:
    """Write config, random weights and tokenizer for `arch` into `folder`; return the folder."""
    import importlib

    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder)
    config = dict(ARCHS[arch], vocab_size=vocab, **overrides)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    weights = {k: v.astype(getattr(mx, dtype)) for k, v in tree_flatten(model.parameters())}
    # Larger embeddings than the default init make attention peaked rather than flat.
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] * 2
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


#: A Jinja chat template in the common role-marker style; the markers are plain text to this tokenizer.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def with_chat_template(source: Path, folder: Path, template: str = CHAT_TEMPLATE) -> Path:
    """A copy of the model folder `source` whose tokenizer_config.json carries `template`; return the copy."""
    import shutil

    shutil.copytree(source, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return folder
