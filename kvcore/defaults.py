"""The one definition of every compression constant and default: the engine, CLI, controls and settings import it.

Kept free of MLX so the GUI, the CLI's argument parsing and the training script can import it cheaply.
"""

from __future__ import annotations

#: Widths `mx.quantize` packs; 16 in the UI and CLI means "not quantized".
ALLOWED_BITS: tuple[int, ...] = (2, 3, 4, 5, 6, 8)
UNQUANTIZED_BITS = 16


def bits_or_none(bits: int | None) -> int | None:
    """A width as the engine holds it: None for unquantized, which the UI and CLI spell UNQUANTIZED_BITS."""
    return None if bits is None or bits == UNQUANTIZED_BITS else int(bits)


#: Group sizes `mx.quantize` accepts (each must divide head_dim).
ALLOWED_GROUP_SIZES: tuple[int, ...] = (32, 64, 128)

#: When the prompt is compressed relative to its last token.
#: "paper": the whole prompt is prefilled densely and compressed, observation windows end at its last token, and
#: the first generated token comes from the dense prefill (SnapKV, PyramidKV, KVCache-Factory, kvpress).
#: "mlx-lm": the prompt minus its last token is compressed and the last token is fed through the compressed cache
#: (mlx-lm's quantized-cache schedule), so every window ends one token before the retrieving query.
SCHEDULES: tuple[str, ...] = ("paper", "mlx-lm")
DEFAULT_SCHEDULE = "paper"
SCHEDULE_HELP: dict[str, str] = {
    "paper": (
        "Compress the whole prompt; observation windows end at its last token; the first generated token comes "
        "from the dense prefill (SnapKV, PyramidKV, kvpress)"
    ),
    "mlx-lm": (
        "Compress the prompt minus its last token, then feed that token through the compressed cache "
        "(mlx-lm's schedule): every generated token sees the compression"
    ),
}

#: The compression a fresh session, the controls, the settings and the CLI start from (bits None: unquantized).
DEFAULT_METHOD = "snapkv"
DEFAULT_RATIO = 0.25
DEFAULT_BITS: int | None = None
#: The values' width; None packs them at the keys' width (`bits`). Split widths: 8-bit keys, 4-bit values.
DEFAULT_VALUE_BITS: int | None = None
#: The values' width the app's "Separate K/V" toggle starts from (with 8-bit keys: mlx-lm issue 1550's K8/V4).
DEFAULT_SPLIT_VALUE_BITS = 4
DEFAULT_GROUP_SIZE = 64
#: The quantization scheme (a module of kvcore.quant) that packs K and V: MLX's affine integers.
DEFAULT_QUANT = "affine"
#: Full-precision residual (KIVI-style): the kept sinks and the last R prompt positions stay float beside the
#: packed rest, and decoded tokens too; 0 packs everything kept.
DEFAULT_FP_RECENT = 0
#: Layer-adaptive widths (kvcore.engine.session.CompressionConfig): a width per layer (none: every layer at the
#: configuration's widths), or the first and last EDGE_LAYERS layers at EDGE_BITS (turboquant-mlx's default idea:
#: the layers nearest the embeddings and the logits are the most sensitive).
DEFAULT_LAYER_BITS: tuple[int, ...] = ()
DEFAULT_EDGE_LAYERS = 0
DEFAULT_EDGE_BITS = 8
#: KIVI's defaults (Liu et al. 2024): keys quantized per channel in groups of 32 tokens, the last 128 tokens float.
KIVI_GROUP_SIZE = 32
KIVI_RESIDUAL = 128
DEFAULT_PER_HEAD = True
#: Observation window: the last prompt queries that vote (SnapKV's 64 here); also the window whose attention the
#: statistics' "attention mass kept" is measured over.
DEFAULT_WINDOW = 64
DEFAULT_N_SINK = 4
DEFAULT_KERNEL = 5
DEFAULT_SEED = 0
#: pyramidkv's steepness: the top layer keeps 1/beta of the mean budget (the authors' 20).
PYRAMIDKV_BETA = 20
#: adakv's safeguard: the share of the mean budget every head keeps (the paper's 0.2).
ADAKV_ALPHA = 0.2
#: The same as the config dict the GUI's controls emit (a `CompressionConfig` less its seed).
DEFAULT_CONFIG: dict[str, object] = {
    "method": DEFAULT_METHOD,
    "ratio": DEFAULT_RATIO,
    "bits": DEFAULT_BITS,
    "value_bits": DEFAULT_VALUE_BITS,
    "fp_recent": DEFAULT_FP_RECENT,
    "group_size": DEFAULT_GROUP_SIZE,
    "per_head": DEFAULT_PER_HEAD,
    "window": DEFAULT_WINDOW,
    "n_sink": DEFAULT_N_SINK,
    "kernel": DEFAULT_KERNEL,
    "schedule": DEFAULT_SCHEDULE,
    "params": {},  # the method's parameters other than window, n_sink and kernel (snapkv has none)
    "quant": DEFAULT_QUANT,
}
#: Tokens of the dense greedy continuation a prefill computes (GUI and CLI).
DEFAULT_CONTINUATION_TOKENS = 32
#: Tokens a teacher-forced reference pass feeds at once (Session._reference_logits): its attention scores are
#: chunk x (T + n) per query head instead of n x (T + n), so an 8k-token continuation stays within bounded memory.
REFERENCE_CHUNK = 512
#: Tokens appended between two evictions of a decoding policy (kvcore.engine.decoding).
DEFAULT_DECODE_INTERVAL = 16

#: Queries captured at prefill; a method's window can go up to this without a new prefill.
CAPTURE_WINDOW = 256
#: expected_attention: the first positions whose pre-RoPE queries capture keeps one by one (the statistics of the
#: rest are running sums), so its n_sink can go up to this without a new prefill.
QUERY_STATS_HEAD = 64
#: expected_attention: the future query positions T … T + 511 whose RoPE rotations are averaged (kvpress).
FUTURE_POSITIONS = 512

#: `kvlens sweep` and the Sweep dock start from the same grid: three methods of different kinds, four ratios.
DEFAULT_SWEEP_METHODS: tuple[str, ...] = ("streaming_llm", "snapkv", "h2o")
DEFAULT_SWEEP_RATIOS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75)
DEFAULT_SWEEP_BITS: tuple[int, ...] = (UNQUANTIZED_BITS,)

#: `kvlens probe` defaults: the methods whose ordering the probes show, and a small depth × length grid.
DEFAULT_PROBE_METHODS: tuple[str, ...] = ("snapkv", "adakv", "streaming_llm", "random")
DEFAULT_PROBE_RATIOS: tuple[float, ...] = (0.25, 0.5)
DEFAULT_PROBE_DEPTHS: tuple[float, ...] = (0.1, 0.5, 0.9)
DEFAULT_PROBE_LENGTHS: tuple[int, ...] = (800, 1600)
#: The Needle grid dock's first family and seed: a held-out form in which the demo model's dense cache recalls every
#: cell of the grid above (argparse_default, the first held-out form, missed 4 of 6), so a miss is the method's.
#: Measured on the demo model (CPU, seeds 0–2): dense, snapkv and adakv at 25 % and 50 % recall 18/18;
#: streaming_llm 7/18 at 25 % (the needles at depth 0.9), random 1/18.
DEFAULT_PROBE_FAMILY = "rust_assert"
DEFAULT_PROBE_SEED = 0

#: Prompt-set summaries: a percentile bootstrap over prompts, seeded so the same rows give the same interval.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
#: Fewer prompts than this and a summary's interval is marked: resampling so few values gives little more than
#: their min–max (with 2 prompts exactly that), not a 95 % interval one could lean on.
MIN_PROMPTS_FOR_INTERVAL = 10

#: How a prefill records h2o's column sums: "eager" computes them chunk by chunk during the prefill (no prefill
#: queries kept beyond the capture window), "lazy" keeps every chunk's queries and computes the same sums when h2o is
#: first asked for (H_q/(2·H_kv) × the dense cache until then), "auto" picks by backend (GPU eager, CPU lazy).
H2O_CAPTURE_MODES: tuple[str, ...] = ("auto", "eager", "lazy")
DEFAULT_H2O_CAPTURE = "auto"
#: Environment variable that overrides "auto" (set it to "eager" or "lazy").
H2O_CAPTURE_ENV = "KVLENS_H2O_CAPTURE"
#: On a GPU without kvcore's CUDA kernels (Metal), "auto" keeps the prefill queries (lazy h2o) while they take at most
#: this share of the memory left free: eager sums through MLX's operations cost 2.8x (8k) to 12x (32k) a plain
#: prefill on the H200, kept queries none (kvcore.capture.h2o_mode).
LAZY_QUERY_SHARE = 0.25

#: Environment variable that switches kvcore's CUDA kernels off ("0"), for side-by-side runs against the MLX path.
FUSED_KERNELS_ENV = "KVLENS_FUSED_KERNELS"

#: Tokens each question's answer runs to in the app's Questions panel (short: an answer is a name or a value).
DEFAULT_ANSWER_TOKENS = 8
#: Positions marked per (layer, kv-head) row when the heatmap shows where a question attends over the context.
QUESTION_ATTENTION_TOP = 8

# -- kvlens ruler (kvcore.probes.ruler) ----------------------------------------------------------------------------
#: kvpress's RULER leaderboard: 4k tokens, compression ratios (1 − retention) 0.25 … 0.875.
DEFAULT_RULER_LENGTH = 4096
DEFAULT_RULER_RATIOS: tuple[float, ...] = (0.25, 0.5, 0.75, 0.875)
DEFAULT_RULER_METHODS: tuple[str, ...] = ("dense", "snapkv", "streaming_llm", "knorm")
DEFAULT_RULER_SAMPLES = 20
DEFAULT_RULER_HAYSTACK = "code"

#: h2o_online (Zhang et al. 2023): the share of a decoding budget kept as the recent window; the rest are heavy
#: hitters (the paper splits its cache evenly between the two).
H2O_RECENT_SHARE = 0.5

#: A layer's prompt queries (kept by a lazy-h2o capture) stay after h2o's sums are computed when they take at most
#: this many bytes, so non_causal_attention and compactor still run after h2o; larger ones are freed (8B at 32k
#: tokens: 268 MB a layer).
KEEP_PROMPT_QUERIES_BYTES = 64 * 2**20

# Calibrated methods (qfilter, expected_attention_stats): artifacts in the user data folder, keyed by model.
APP_DATA_NAME = "KV Lens"  # platformdirs' application folder name
DATA_DIR_ENV = "KVLENS_DATA_DIR"  # overrides the user data folder (tests, shared machines)
CALIBRATION_VERSION = 1  # the artifact format; a file of another version is refused, never overwritten

#: cam (Zhang et al. 2024, kvpress's CAMPress): the kept rows after an evicted one that its value is merged into.
CAM_MERGE_BUDGET = 32

#: rkv (Cai et al. 2025, R-KV), the authors' released defaults: the observation window (latest queries, always
#: kept), the max-pooling kernel over their attention, λ mixing importance and redundancy, and the cosine similarity
#: above which two keys count as redundant.
RKV_WINDOW = 8
RKV_KERNEL = 7
RKV_LAMBDA = 0.07
RKV_SIMILARITY_THRESHOLD = 0.5
#: The decoding policies that are not prefill methods (kvcore.engine.decoding), for their tooltips: (one-line
#: definition, paper). The others are prefill methods re-scored while decoding: their own declarations apply.
DECODE_POLICY_HELP: dict[str, tuple[str, str]] = {
    "h2o_online": (
        "H2O as its paper defines it: attention accumulated over every query seen so far, prompt and generated; "
        "heavy hitters plus a recent window (half the budget)",
        "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models (Zhang et al. 2023), "
        "arXiv:2306.14048",
    ),
    "dms": (
        "kvpress's DMSPress while decoding, over knorm's scores: the newest rows a sliding window, an older row "
        "evicted once its score falls below the threshold",
        "Inference-Time Hyper-Scaling with KV Cache Compression (DMS, Łańcucki et al. 2025), arXiv:2506.05345",
    ),
    "cam": (
        "The rolling window (sinks and the most recent rows), each evicted value merged into the kept rows after it "
        "by its attention share",
        "CaM: Cache Merging for Memory-efficient LLMs Inference (Zhang et al., ICML 2024), "
        "openreview.net/forum?id=LCTmppB165",
    ),
}

#: The most attention scores one step of a context re-read (kvcompose's replay) holds per layer: MLX's CPU attention
#: writes H_q x step x keys of them, and one pass of an 8k context over its 16k keys with 32 query heads is 2^32
#: (16 GiB, past 32-bit indexing); steps of at most 2^28 hold 1 GiB, and a short prompt still goes in one step.
REREAD_SCORES = 1 << 28

#: The most attention scores one prefill chunk may hold per layer (query heads x chunk x keys): MLX's CPU attention
#: and the capture's own h2o sums write them all, and past 2^31 elements MLX's 32-bit indexing segfaults. 2^30 keeps
#: 2048-token chunks up to 16k keys with 32 query heads and shrinks them after (1,024 at 32k), so a long prompt
#: on a large model prefills rather than crashes.
PREFILL_SCORES = 1 << 30

#: kvzap (Jegou et al. 2026, kvpress's KVzapPress and its training script): the surrogate's hidden width (mlp), the
#: training run (AdamW with weight decay, cosine learning rate, gradient norm clipped, minibatches of rows), the
#: positions sampled from each calibration prompt (kvpress samples 500 of 750-1250-token texts), the share of the
#: prompts held out, and the floor under a kvzip+ score before its log is taken (the target is log(score)).
KVZAP_HIDDEN_DIM = 512
KVZAP_EPOCHS = 15
KVZAP_LEARNING_RATE = 5e-3
KVZAP_WEIGHT_DECAY = 0.01
KVZAP_GRAD_CLIP = 1.0
KVZAP_BATCH_ROWS = 512
KVZAP_POSITIONS = 512
KVZAP_SEED = 0
KVZAP_HELD_OUT = 0.1
KVZAP_SCORE_FLOOR = 1e-12
#: The linear surrogate's ridge penalty: kvpress fits it by scikit-learn's `Ridge()` (alpha 1, intercept unpenalised).
KVZAP_RIDGE_ALPHA = 1.0
#: The surrogate's and the shards' format: another version is refused (surrogate) or collected again (shards).
KVZAP_VERSION = 1
