"""Train KV Lens's demo model end to end: corpus -> tokenizer -> training -> export -> eval.

The app, its tests and CI need a real model that is always there and loads offline, with attention that is
peaked enough for the heatmaps to mean something. This script builds one from text every machine has: the
CPython standard library (English from ``pydoc_data/topics.py`` included) plus the Python sources of the
installed packages (``site.getsitepackages()``, test folders excluded). A fixed list of standard-library
files is held out for evaluation (and is the probes' filler). A share of the training sequences are synthetic
documents from ``kvcore.probes.training`` — needles in the training probe families, key–value tables, repeated
blocks, variable tracking, long identifiers, all on training code — because code alone does not teach a small
model to retrieve (DESIGN.md). Training uses PyTorch + transformers (``LlamaForCausalLM``); the export is the
Hugging Face layout that ``mlx_lm.load(path)`` reads. The dense model's needle recall is measured at the end on
held-out and training probe families (``kvcore.probes``).

Typical runs::

    python scripts/train_demo_model.py --out /tmp/kvlens-demo --time-budget-min 8   # CUDA, H200 (TRAINING.md)
    python scripts/train_demo_model.py --device cpu --steps 50 --batch-size 4 \\
        --max-site-mb 5 --out /tmp/kvlens-demo                                        # slow CPU smoke run
    python scripts/train_demo_model.py --stop-after tokenizer --out /tmp/tok          # corpus + tokenizer only
    python scripts/train_demo_model.py --out /tmp/next --init-from resources/models/kvlens-demo --seed 1 \\
        --lr 7e-4 --min-lr-frac 0.03 --time-budget-min 8.2                             # continue the shipped model
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import site
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # kvcore.probes (MLX-free) without installing the package

from kvcore.probes.training import SHIPPED_MIX, NeedleMix  # noqa: E402

EOS = "<|endoftext|>"

#: Standard-library files never trained on; their text is the held-out evaluation set.
HELDOUT = (
    "bisect.py",
    "calendar.py",
    "colorsys.py",
    "csv.py",
    "difflib.py",
    "fractions.py",
    "ftplib.py",
    "graphlib.py",
    "heapq.py",
    "ipaddress.py",
    "json/encoder.py",
    "shlex.py",
    "statistics.py",
    "string.py",
    "textwrap.py",
    "wave.py",
)

#: Folders skipped everywhere: tests (as DESIGN.md measured), caches, nested package trees.
EXCLUDED_DIRS = frozenset(
    {"test", "tests", "testing", "idle_test", "__pycache__", "site-packages", "dist-packages"}
)
MAX_FILE_BYTES = 1_000_000  # larger .py files are generated tables, not code worth learning

_COMMON_SHAPE = dict(
    num_hidden_layers=8,
    num_key_value_heads=2,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
#: "small" is the shipped model (15.7 M, bf16 under the 32 MiB cap); "wide" (28.3 M) needs 8-bit storage to fit.
MODEL_SHAPES = {
    "small": dict(_COMMON_SHAPE, hidden_size=384, intermediate_size=1024, num_attention_heads=6),
    "wide": dict(_COMMON_SHAPE, hidden_size=512, intermediate_size=1536, num_attention_heads=8),
}
#: Peak learning rate per shape: 1.5e-3 was tuned at width 384; scaled ~1/width for 512.
PEAK_LR = {"small": 1.5e-3, "wide": 1.2e-3}


@dataclass
class Corpus:
    """Documents with stable labels ("stdlib/json/decoder.py", "site0/numpy/core/...")."""

    roots: dict[str, str]
    train: list[tuple[str, str]] = field(default_factory=list)
    heldout: list[tuple[str, str]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    def describe(self) -> dict:
        """Counts and hashes that pin down exactly which files were used."""
        names = sorted(label for label, _ in self.train)
        by_label = dict(self.train)
        content = hashlib.sha256()
        for label in names:
            content.update(hashlib.sha256(by_label[label].encode()).digest())
        per_root: dict[str, int] = {}
        for label in names:
            key = label.split("/", 1)[0]
            per_root[key] = per_root.get(key, 0) + 1
        return {
            "roots": self.roots,
            "train_files": len(names),
            "train_files_per_root": per_root,
            "train_bytes": sum(len(t.encode()) for _, t in self.train),
            "train_list_sha256": hashlib.sha256("\n".join(names).encode()).hexdigest(),
            "train_content_sha256": content.hexdigest(),
            "heldout_files": [label for label, _ in self.heldout],
            "heldout_bytes": sum(len(t.encode()) for _, t in self.heldout),
            "skipped": self.skipped,
            "rules": (
                f"*.py under each root; folders {sorted(EXCLUDED_DIRS)} and dot-folders skipped; "
                f"test_*.py / *_test.py skipped; files > {MAX_FILE_BYTES} bytes or not UTF-8 skipped; "
                "exact duplicates (by content) kept once, in sorted-label order, stdlib first; "
                "held-out contents never trained on"
            ),
        }


def _iter_py(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if not name.endswith(".py") or name.startswith("test_") or name.endswith("_test.py"):
                continue
            yield Path(dirpath) / name


def collect_corpus(use_site: bool = True, max_site_mb: float | None = None) -> Corpus:
    """Read the standard library and (optionally) the installed packages' sources, holding out HELDOUT."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    roots = {"stdlib": str(stdlib)}
    if use_site:
        for p in site.getsitepackages():
            resolved = str(Path(p).resolve())
            if Path(p).is_dir() and resolved not in roots.values():
                roots[f"site{len(roots) - 1}"] = resolved
    corpus = Corpus(roots=roots)
    skipped = {"too_large": 0, "not_utf8": 0, "duplicate": 0, "heldout_copy": 0, "site_budget": 0}
    seen: set[str] = set()
    heldout_hashes: set[str] = set()
    for rel in HELDOUT:
        text = (stdlib / rel).read_text(encoding="utf-8")
        corpus.heldout.append((f"stdlib/{rel}", text))
        heldout_hashes.add(hashlib.sha256(text.encode()).hexdigest())
    site_budget = None if max_site_mb is None else int(max_site_mb * 1e6)
    site_bytes = 0
    for key, root in roots.items():
        for path in _iter_py(Path(root)):
            rel = path.relative_to(root).as_posix()
            if key == "stdlib" and rel in HELDOUT:
                continue
            try:
                raw = path.read_bytes()
            except OSError:
                continue
            if len(raw) > MAX_FILE_BYTES:
                skipped["too_large"] += 1
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skipped["not_utf8"] += 1
                continue
            digest = hashlib.sha256(raw).hexdigest()
            if digest in heldout_hashes:
                skipped["heldout_copy"] += 1
                continue
            if digest in seen or not text.strip():
                skipped["duplicate"] += 1
                continue
            if key != "stdlib" and site_budget is not None and site_bytes + len(raw) > site_budget:
                skipped["site_budget"] += 1
                continue
            seen.add(digest)
            if key != "stdlib":
                site_bytes += len(raw)
            corpus.train.append((f"{key}/{rel}", text))
    corpus.skipped = skipped
    return corpus


def train_tokenizer(corpus: Corpus, vocab_size: int, sample_mb: float, out: Path):
    """Byte-level BPE on the stdlib plus an evenly spaced sample of the rest (BPE training is RAM-bound)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    std = [t for label, t in corpus.train if label.startswith("stdlib/")]
    rest = [t for label, t in corpus.train if not label.startswith("stdlib/")]
    budget = max(0.0, sample_mb * 1e6 - sum(len(t) for t in std))
    rest_bytes = sum(len(t) for t in rest)
    stride = max(1, math.ceil(rest_bytes / budget)) if budget > 0 else len(rest) + 1
    texts = std + rest[::stride]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": EOS,
                "bos_token": None,
                "pad_token": EOS,
                "add_bos_token": False,
                "clean_up_tokenization_spaces": False,
                "model_max_length": _COMMON_SHAPE["max_position_embeddings"],
            },
            indent=1,
        )
        + "\n"
    )
    return tok


def write_file_list(corpus: Corpus, path: Path) -> None:
    """The sorted training file labels, gzipped (mtime 0 so the bytes depend on the list alone)."""
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    data = ("\n".join(sorted(label for label, _ in corpus.train)) + "\n").encode()
    path.write_bytes(gzip.compress(data, mtime=0))


def installed_packages() -> list[str]:
    """`name==version` of every distribution whose sources may be in the corpus."""
    from importlib import metadata

    found = {(d.metadata["Name"] or "?", d.version) for d in metadata.distributions()}
    return sorted(f"{name}=={version}" for name, version in found)


def reuse_tokenizer(path: Path, out: Path):
    """Copy an existing tokenizer.json (and its config) into the output: same ids as the model it came from."""
    import shutil

    from tokenizers import Tokenizer

    out.mkdir(parents=True, exist_ok=True)
    if path.resolve() != (out / "tokenizer.json").resolve():
        shutil.copyfile(path, out / "tokenizer.json")
        config = path.parent / "tokenizer_config.json"
        if config.exists():
            shutil.copyfile(config, out / "tokenizer_config.json")
    return Tokenizer.from_file(str(out / "tokenizer.json"))


def encode(tok, docs: list[tuple[str, str]], eos_id: int) -> np.ndarray:
    """Concatenate the documents' token ids, each followed by EOS, as uint16."""
    encode_batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
    parts = []
    for i in range(0, len(docs), 2000):
        for enc in encode_batch([t for _, t in docs[i : i + 2000]]):
            parts.append(np.asarray(enc.ids, dtype=np.uint16))
            parts.append(np.asarray([eos_id], dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


_WORKER: dict = {}


def _init_worker(texts: list[str], tokenizer_path: str, seq: int, mix: NeedleMix) -> None:
    from tokenizers import Tokenizer

    from kvcore.probes.training import code_taker

    _WORKER.update(
        tok=Tokenizer.from_file(tokenizer_path),
        take=code_taker(texts),
        seq=seq,
        mix=mix,
    )


def _make_synthetic(seed: int) -> np.ndarray:
    """One synthetic document cut to exactly seq + 1 tokens (longer text is generated, then truncated)."""
    import random

    from kvcore.probes.training import synthetic_document

    rng = random.Random(seed)
    ids: list[int] = []
    n_chars = int(_WORKER["seq"] * 3.6)
    while len(ids) < _WORKER["seq"] + 1:
        doc = synthetic_document(rng, _WORKER["take"], n_chars, mix=_WORKER["mix"])
        ids = _WORKER["tok"].encode(doc).ids
        n_chars = int(n_chars * 1.3)
    return np.asarray(ids[: _WORKER["seq"] + 1], dtype=np.uint16)


class SyntheticStream:
    """Synthetic sequences made by a worker pool while the GPU trains, `ahead` rows ahead of use.

    Row i is always the document of seed `seed * 10_000_000 + i`, however fast the workers run, so a run resumed
    at row k continues exactly the sequence an unpaused run would have used (fork shares the corpus; the pool is
    forked before CUDA starts)."""

    def __init__(
        self,
        texts: list[str],
        tokenizer_path: Path,
        seq: int,
        seed: int,
        workers: int,
        mix: NeedleMix,
        start: int = 0,
        ahead: int = 16_384,
        block: int = 2_048,
    ) -> None:
        import multiprocessing as mp
        import threading

        self.seq, self.next = seq, start
        self._base = seed * 10_000_000
        self._block, self._ahead = block, ahead
        self._rows: dict[int, np.ndarray] = {}
        self._made = start
        self._cond = threading.Condition()
        self._stop = False
        self._error: BaseException | None = None
        ctx = mp.get_context("fork")
        self._pool = ctx.Pool(
            workers, initializer=_init_worker, initargs=(texts, str(tokenizer_path), seq, mix)
        )
        self._thread = threading.Thread(target=self._fill, daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop and self._made - self.next >= self._ahead:
                        self._cond.wait(0.5)
                    if self._stop:
                        return
                    first = self._made
                seeds = range(self._base + first, self._base + first + self._block)
                rows = self._pool.map(_make_synthetic, seeds, chunksize=32)
                with self._cond:
                    for i, row in enumerate(rows):
                        self._rows[first + i] = row
                    self._made = first + len(rows)
                    self._cond.notify_all()
        except BaseException as exc:  # surfaced by take(): a dead producer must not hang training
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def take(self, n: int) -> np.ndarray:
        """The next `n` rows (waits for the workers when training outruns them)."""
        with self._cond:
            while self._made < self.next + n:
                if self._error is not None:
                    raise RuntimeError("synthetic document workers failed") from self._error
                self._cond.wait(0.5)
            rows = [self._rows.pop(i) for i in range(self.next, self.next + n)]
            self.next += n
            self._cond.notify_all()
        return np.stack(rows)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        self._pool.terminate()


def encoded_ids(args, tok, corpus: Corpus, content_sha256: str, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Training and held-out ids; with --ids-cache, encoded once and read back by later pieces (keyed by the
    corpus's content hash and the stdlib weight, loaded without pickle)."""
    key = f"{content_sha256[:16]}-x{args.stdlib_weight}"
    paths = [args.ids_cache / f"{key}-{part}.npy" for part in ("train", "heldout")] if args.ids_cache else []
    if paths and all(p.exists() for p in paths):
        return tuple(np.load(p, allow_pickle=False) for p in paths)
    stdlib_docs = [d for d in corpus.train if d[0].startswith("stdlib/")]
    ids = (
        encode(tok, corpus.train + stdlib_docs * (args.stdlib_weight - 1), eos_id),
        encode(tok, corpus.heldout, eos_id),
    )
    for path, array in zip(paths, ids if paths else (), strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.stem + ".tmp.npy")
        np.save(tmp, array, allow_pickle=False)
        os.replace(tmp, path)
    return ids


def unigram_baseline(train_ids: np.ndarray, heldout_ids: np.ndarray, vocab: int) -> dict:
    """Next-token figures of a model that ignores context (add-one smoothed train frequencies)."""
    counts = np.bincount(train_ids, minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    targets = heldout_ids[1:].astype(np.int64)
    return {
        "nll_per_token": float(-logp[targets].mean()),
        "top1": float((targets == int(counts.argmax())).mean()),
    }


def mlx_config(shape: str, vocab_size: int, eos_id: int, dtype: str) -> dict:
    """config.json in the LlamaForCausalLM layout that mlx-lm's `llama` model reads."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        **MODEL_SHAPES[shape],
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": dtype,
    }


def save_checkpoint(path: Path, model, opt, gen, state: dict) -> None:
    """Model, AdamW moments and the sampler's RNG as safetensors, the counters as JSON (nothing is pickled).

    Lets one training run span two device sessions; written to a temp name and renamed, so a run killed mid-write
    leaves the previous checkpoint whole."""
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    opt_state = opt.state_dict()
    for pid, entry in opt_state["state"].items():
        for key, value in entry.items():
            tensors[f"opt.{pid}.{key}"] = (
                value.detach().reshape(-1).contiguous() if value.dim() == 0 else value
            )
    tensors["rng"] = gen.get_state()
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.cpu() for k, v in tensors.items() if k != "model.lm_head.weight"}, str(tmp))
    meta = path.with_suffix(".json")
    meta_tmp = meta.with_name(meta.name + ".tmp")
    meta_tmp.write_text(json.dumps({**state, "param_groups": opt_state["param_groups"]}, indent=1))
    os.replace(tmp, path)
    os.replace(meta_tmp, meta)


def load_checkpoint(path: Path, model, opt, gen, device) -> dict:
    """The inverse of `save_checkpoint`; returns the counters."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(path), device=str(device))
    meta = json.loads(path.with_suffix(".json").read_text())
    loaded = model.load_state_dict(
        {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, strict=False
    )
    if loaded.unexpected_keys or set(loaded.missing_keys) - {"lm_head.weight"}:
        raise RuntimeError(f"checkpoint does not fit the model: {loaded}")
    state: dict = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = value.reshape(()) if name == "step" else value
    opt.load_state_dict({"state": state, "param_groups": meta.pop("param_groups")})
    gen.set_state(tensors["rng"].to("cpu", torch.uint8))
    return meta


def load_weights(folder: Path, model) -> None:
    """Start from an exported model (the HF-layout shards `export` writes): a warm start without AdamW state,
    so a run that continues a shipped model fits one device call."""
    from safetensors.torch import load_file

    state = {}
    for shard in sorted(folder.glob("model*.safetensors")):
        state.update(load_file(str(shard)))
    if not state:
        raise FileNotFoundError(f"no model*.safetensors in {folder}")
    own = model.state_dict()
    loaded = model.load_state_dict(
        {k: v.to(own[k].dtype) for k, v in state.items() if k in own}, strict=False
    )
    if set(state) - set(own) or set(loaded.missing_keys) - {"lm_head.weight"}:
        raise RuntimeError(f"{folder} does not fit the {len(own)}-tensor model: {loaded}")


def checkpoint_counters(path: Path | None) -> dict:
    """The counters of a saved checkpoint (empty when there is none): where the synthetic stream resumes."""
    if path is None or not path.exists():
        return {}
    return json.loads(path.with_suffix(".json").read_text())


def build_model(shape: str, vocab_size: int, eos_id: int, device):
    """A fresh `LlamaForCausalLM` of MODEL_SHAPES[shape] on `device`, embeddings tied to the LM head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, bos_token_id=eos_id, eos_token_id=eos_id, **MODEL_SHAPES[shape]
    )
    model = LlamaForCausalLM(config).to(device)
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def make_step_loss(model, vocab_size: int, compiled: bool):
    """window (batch, seq + 1) -> mean next-token loss under bf16 autocast on CUDA.

    Compiled whole, so the (batch, seq, vocab) logits' float cast and cross-entropy fuse with the LM head
    instead of materialising 2 GB of float32 logits per step in eager code."""
    import torch
    import torch.nn.functional as F

    amp = next(model.parameters()).device.type == "cuda"

    def step_loss(window):
        with torch.autocast("cuda" if amp else "cpu", dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=window[:, :-1]).logits
        return F.cross_entropy(logits.float().reshape(-1, vocab_size), window[:, 1:].reshape(-1))

    return torch.compile(step_loss) if compiled else step_loss


class TailAverage:
    """Uniform running mean of the weights from `start` (a share of the run's progress) to its end.

    Averaging the last stretch of a run cancels part of the step noise that the cosine's tail would otherwise
    have to anneal away; the mean is exported beside the last weights so both can be measured."""

    def __init__(self, model, start: float):
        self.params = list(model.parameters())
        self.start = start
        self.n = 0
        self.mean = None

    def update(self, progress: float) -> None:
        if not self.start or progress < self.start:
            return
        import torch

        self.n += 1
        with torch.no_grad():
            if self.mean is None:
                self.mean = [p.detach().float().clone() for p in self.params]
            else:
                torch._foreach_lerp_(self.mean, [p.detach().float() for p in self.params], 1.0 / self.n)

    def swap_into(self, model) -> None:
        """Put the mean into the model's parameters (the last weights are not kept)."""
        import torch

        with torch.no_grad():
            for p, m in zip(self.params, self.mean, strict=True):
                p.copy_(m)


def train_model(args, train_ids: np.ndarray, synthetic, vocab_size: int, eos_id: int, log):
    """AdamW + cosine on random windows; `synthetic_share` of every batch is synthetic retrieval documents.

    The last `long_frac` of progress runs at `long_seq` (with --seq-len = --long-seq, 2048 throughout). With
    --checkpoint, a run resumes from it when it exists and, after --pause-after-min, saves it and returns
    `paused`: the cosine follows the whole --time-budget-min across the pieces."""
    import torch

    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model = build_model(args.shape, vocab_size, eos_id, device)
    if args.init_from:
        load_weights(args.init_from, model)
        log(f"initialised from {args.init_from}")
    compiled = args.compile and device.type == "cuda"
    step_loss = make_step_loss(model, vocab_size, compiled)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters (tied embeddings)")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",
    )
    data = torch.from_numpy(train_ids.astype(np.int64)).to(device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    budget_s = args.time_budget_min * 60 if args.time_budget_min else None
    pause_s = args.pause_after_min * 60 if args.pause_after_min else None
    step, tokens, before_s, pieces, commands = 0, 0, 0.0, 1, []
    if args.checkpoint and args.checkpoint.exists():
        done = load_checkpoint(args.checkpoint, model, opt, gen, device)
        step, tokens, before_s, pieces = (
            done["step"],
            done["tokens"],
            done["train_seconds"],
            done["pieces"] + 1,
        )
        commands = done.get("commands", [])
        if synthetic is not None and synthetic.next != done["synthetic_next"]:
            raise RuntimeError("the synthetic stream must start where the checkpoint stopped")
        log(f"resumed at step {step} after {before_s:.0f} s of training (piece {pieces})")
    t0 = time.time()
    paused = False
    average = TailAverage(model, args.average_from)
    model.train()
    while step < args.steps:
        elapsed = before_s + time.time() - t0
        progress = step / args.steps
        if budget_s:
            if elapsed >= budget_s:
                log(f"time budget reached at step {step}")
                break
            progress = max(progress, elapsed / budget_s)
        if pause_s and time.time() - t0 >= pause_s:
            paused = True
            break
        long = progress >= 1.0 - args.long_frac
        seq = args.long_seq if long else args.seq_len
        bsz = max(1, args.batch_size * args.seq_len // seq)
        if step < args.warmup:
            lr = args.lr * (step + 1) / args.warmup
        else:
            floor = args.min_lr_frac
            lr = args.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
        for g in opt.param_groups:
            g["lr"] = lr
        n_syn = round(args.synthetic_share * bsz) if synthetic is not None and seq == synthetic.seq else 0
        starts = torch.randint(0, data.numel() - seq - 1, (bsz - n_syn,), device=device, generator=gen)
        window = data[starts[:, None] + torch.arange(seq + 1, device=device)]
        if n_syn:
            rows = torch.from_numpy(synthetic.take(n_syn).astype(np.int64)).to(device)
            window = torch.cat([window, rows])
        try:
            loss = step_loss(window)
        except Exception as exc:  # torch.compile unavailable or failing: train uncompiled
            if not compiled:
                raise
            log(f"torch.compile failed ({type(exc).__name__}: {exc}); training uncompiled")
            compiled = False
            step_loss = make_step_loss(model, vocab_size, compiled)
            continue
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        average.update(progress)
        step += 1
        tokens += bsz * seq
        if step % args.log_every == 0 or step == 1:
            log(
                f"step {step:5d} seq {seq} loss {loss.item():.4f} lr {lr:.2e} "
                f"{before_s + time.time() - t0:7.1f}s {tokens / (before_s + time.time() - t0):,.0f} tok/s"
            )
    syn_used = synthetic.next if synthetic is not None else 0
    stats = {
        "synthetic_sequences_used": syn_used,
        "steps": step,
        "tokens_seen": tokens,
        "train_seconds": round(before_s + time.time() - t0, 1),
        "pieces": pieces,
        "final_train_loss": float(loss.item()) if step else float("nan"),
        "parameters": n_params,
        "paused": paused,
        "averaged_steps": average.n,
        "piece_commands": [*commands, " ".join(sys.argv)],
    }
    if synthetic is not None:
        synthetic.close()
    if paused:
        save_checkpoint(
            args.checkpoint,
            model,
            opt,
            gen,
            {
                "step": step,
                "tokens": tokens,
                "train_seconds": stats["train_seconds"],
                "pieces": pieces,
                "synthetic_next": syn_used,
                "commands": stats["piece_commands"],
            },
        )
        log(f"paused at step {step} after {stats['train_seconds']:.0f} s; checkpoint {args.checkpoint}")
    return model, average, stats


def evaluate(model, ids: np.ndarray, seq: int, device: str, batch: int = 16) -> dict:
    """Top-1 and NLL/token over non-overlapping windows; also split by position (< 1024 and >= 1024)."""
    import torch
    import torch.nn.functional as F

    model.eval()
    n = (len(ids) - 1) // seq
    x = torch.from_numpy(ids[: n * seq + 1].astype(np.int64))
    inputs = x[:-1].reshape(n, seq)
    targets = x[1:].reshape(n, seq)
    nll = torch.zeros(seq, dtype=torch.float64)
    hit = torch.zeros(seq, dtype=torch.float64)
    amp = torch.device(device).type == "cuda"
    with torch.no_grad():
        for i in range(0, n, batch):
            inp = inputs[i : i + batch].to(device)
            tgt = targets[i : i + batch].to(device)
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=amp):
                logits = model(input_ids=inp).logits.float()
            loss = F.cross_entropy(logits.transpose(1, 2), tgt, reduction="none")
            nll += loss.double().sum(0).cpu()
            hit += (logits.argmax(-1) == tgt).double().sum(0).cpu()
    out = {
        "seq_len": seq,
        "tokens": n * seq,
        "nll_per_token": float(nll.sum() / (n * seq)),
        "top1": float(hit.sum() / (n * seq)),
    }
    if seq > 1024:
        out["nll_positions_ge_1024"] = float(nll[1024:].sum() / (n * (seq - 1024)))
        out["nll_positions_lt_1024"] = float(nll[:1024].sum() / (n * 1024))
    model.train()
    return out


def probe_recall(model, tok, device: str, families: tuple[str, ...], n: int, seed: int) -> dict:
    """Dense greedy recall on `n` probes of `families` (600–1,700 tokens, depth uniform in [0.1, 0.9])."""
    import random

    import torch

    from kvcore.probes import make_probe, recalls

    rng = random.Random(seed)
    hits, per_family = 0, {}
    model.eval()
    with torch.no_grad():
        for i in range(n):
            family = families[i % len(families)]
            probe = make_probe(tok, seed + i, rng.uniform(0.1, 0.9), rng.randint(600, 1700), family)
            ids = torch.tensor([tok.encode(probe.prompt).ids], device=device)
            out = []
            for _ in range(probe.max_new_tokens):
                nxt = int(model(input_ids=ids).logits[0, -1].argmax())
                out.append(nxt)
                ids = torch.cat([ids, torch.tensor([[nxt]], device=device)], dim=1)
            ok = recalls(probe, tok.decode(out))
            hits += ok
            per_family.setdefault(family, [0, 0])
            per_family[family][0] += ok
            per_family[family][1] += 1
    model.train()
    return {"recall": hits / n, "probes": n, "per_family": {k: v[0] / v[1] for k, v in per_family.items()}}


def evaluation(model, tok, heldout_ids: np.ndarray, args, log) -> tuple[dict, dict, dict]:
    """Held-out code at 1,024 and --long-seq tokens, and dense recall on --probe-eval probes of each family set
    (the same probes every run and `--eval-only` draw, so models compare side by side)."""
    from kvcore.probes import HELDOUT_FAMILIES, TRAIN_FAMILIES

    heldout = evaluate(model, heldout_ids, 1024, args.device)
    heldout_long = evaluate(model, heldout_ids, args.long_seq, args.device)
    log(f"held-out @1024: {heldout}")
    log(f"held-out @{args.long_seq}: {heldout_long}")
    recall = {
        "heldout_families": probe_recall(
            model, tok, args.device, HELDOUT_FAMILIES, args.probe_eval, 1_000_000
        ),
        "train_families": probe_recall(model, tok, args.device, TRAIN_FAMILIES, args.probe_eval, 2_000_000),
    }
    log(f"dense probe recall: {json.dumps(recall)}")
    return heldout, heldout_long, recall


def export(model, out: Path, config: dict, dtype: str, shard_mb: float) -> dict:
    """Sharded safetensors + index in the HF layout (each shard small enough to travel back)."""
    import torch
    from safetensors.torch import save_file

    tdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    state = {
        k: v.detach().to("cpu", tdtype).contiguous()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight" and "rotary_emb" not in k
    }
    for old in out.glob("model*.safetensors*"):
        old.unlink()
    shards: list[dict] = [{}]
    size = 0
    for key in sorted(state):
        nbytes = state[key].numel() * state[key].element_size()
        if shards[-1] and size + nbytes > shard_mb * 1e6:
            shards.append({})
            size = 0
        shards[-1][key] = state[key]
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return {"shards": len(shards), "weight_bytes": total}


def write_slice(tok, heldout: list[tuple[str, str]], path: Path, n_tokens: int) -> None:
    """A small held-out text for the tests to re-measure: whole lines from the held-out files."""
    text, used = "", 0
    for _, doc in heldout:
        for line in doc.splitlines(keepends=True):
            used += len(tok.encode(line).ids)
            text += line
            if used >= n_tokens:
                path.write_text(text)
                return
    path.write_text(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("resources/models/kvlens-demo"))
    p.add_argument("--device", default="cuda", help="cuda or cpu")
    p.add_argument("--steps", type=int, default=12000, help="cap; --time-budget-min usually ends it first")
    p.add_argument("--time-budget-min", type=float, default=0.0, help="stop (and finish the cosine) by then")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--long-seq", type=int, default=2048)
    p.add_argument("--long-frac", type=float, default=0.2, help="final share of training at --long-seq")
    p.add_argument(
        "--shape", choices=sorted(MODEL_SHAPES), default="small", help="model shape (MODEL_SHAPES)"
    )
    p.add_argument("--lr", type=float, default=None, help="peak; PEAK_LR of the shape by default")
    p.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=True, help="torch.compile on CUDA"
    )
    p.add_argument("--warmup", type=int, default=150)
    p.add_argument("--min-lr-frac", type=float, default=0.1, help="the cosine ends at this share of the peak")
    p.add_argument(
        "--average-from",
        type=float,
        default=0.0,
        help="also export (to OUT/average) the mean of the weights from this share of the run on (0: off)",
    )
    p.add_argument(
        "--init-from", type=Path, default=None, help="start from this exported model's weights (a warm start)"
    )
    p.add_argument(
        "--same-form-share",
        type=float,
        default=SHIPPED_MIX.same_form_share,
        help="share of needle documents whose bindings share one form (0: the shipped model's documents)",
    )
    p.add_argument(
        "--dense-needle-share",
        type=float,
        default=SHIPPED_MIX.dense_share,
        help="share of needle documents with 6-16 bindings, each asked (0: the shipped model's documents)",
    )
    p.add_argument(
        "--restate-share",
        type=float,
        default=SHIPPED_MIX.restate_share,
        help="share of generic asks that restate the binding's line (0: the shipped model's documents)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=ROOT / "resources/models/kvlens-demo/tokenizer.json",
        help="reuse this tokenizer.json (the shipped one by default); 'train' trains a new one",
    )
    p.add_argument(
        "--synthetic-share", type=float, default=0.30, help="share of each batch that is synthetic"
    )
    p.add_argument(
        "--stdlib-weight",
        type=int,
        default=3,
        help="times each standard-library file is in the code mixture (the held-out code is stdlib style)",
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="resume from this file when it exists; with --pause-after-min, save it there and stop",
    )
    p.add_argument(
        "--pause-after-min", type=float, default=0.0, help="train this long in this process, then checkpoint"
    )
    p.add_argument(
        "--ids-cache", type=Path, default=None, help="folder keeping the encoded corpus between pieces"
    )
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    p.add_argument(
        "--probe-eval", type=int, default=40, help="probes per family set in the final recall eval"
    )
    p.add_argument(
        "--eval-only",
        action="store_true",
        help="measure the --init-from model (held-out code, probes), no training",
    )
    p.add_argument("--tokenizer-sample-mb", type=float, default=48.0)
    p.add_argument("--no-site-packages", action="store_true", help="standard library only (overfits)")
    p.add_argument("--max-site-mb", type=float, default=None, help="cap on site-packages bytes")
    p.add_argument("--export-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--shard-mb", type=float, default=16.0, help="at most 16 MB a shard (the device's limit)")
    p.add_argument("--slice-out", type=Path, default=None, help="write a held-out text slice here")
    p.add_argument("--slice-tokens", type=int, default=1024)
    p.add_argument("--list-out", type=Path, default=None, help="write the sorted training file list here")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--stop-after", choices=["corpus", "tokenizer"], default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.lr is None:
        args.lr = PEAK_LR[args.shape]
    if not 0 <= args.average_from < 1:
        raise SystemExit(f"--average-from is a share of the run in [0, 1), not {args.average_from}")
    if args.average_from and args.pause_after_min:
        raise SystemExit("--average-from needs a run in one piece: the mean is not kept in a checkpoint")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:7.1f}s] {msg}", flush=True)

    corpus = collect_corpus(use_site=not args.no_site_packages, max_site_mb=args.max_site_mb)
    desc = corpus.describe()
    log(
        f"corpus: {desc['train_files']} train files, {desc['train_bytes'] / 1e6:.1f} MB; "
        f"{len(corpus.heldout)} held-out files; list sha256 {desc['train_list_sha256'][:16]}"
    )
    if args.list_out:
        args.list_out.write_text("\n".join(sorted(label for label, _ in corpus.train)) + "\n")
    write_file_list(corpus, args.out / "corpus_files.txt.gz")
    if args.stop_after == "corpus":
        return 0
    if str(args.tokenizer) == "train":
        tok = train_tokenizer(corpus, args.vocab_size, args.tokenizer_sample_mb, args.out)
    else:
        tok = reuse_tokenizer(args.tokenizer, args.out)
    vocab_size = tok.get_vocab_size()
    eos_id = tok.token_to_id(EOS)
    log(f"tokenizer: vocab {vocab_size}, eos id {eos_id}")
    if args.slice_out:
        write_slice(tok, corpus.heldout, args.slice_out, args.slice_tokens)
    if args.stop_after == "tokenizer":
        return 0
    train_ids, heldout_ids = encoded_ids(args, tok, corpus, desc["train_content_sha256"], eos_id)
    log(
        f"tokens: train {len(train_ids):,} (standard library x{args.stdlib_weight}), "
        f"held-out {len(heldout_ids):,}"
    )
    baseline = unigram_baseline(train_ids, heldout_ids, vocab_size)
    log(f"unigram baseline: {baseline}")

    if args.eval_only:
        if args.init_from is None:
            raise SystemExit("--eval-only measures an exported model: name it with --init-from")
        model = build_model(args.shape, vocab_size, eos_id, args.device)
        load_weights(args.init_from, model)
        evaluation(model, tok, heldout_ids, args, log)
        return 0

    synthetic = None
    if args.synthetic_share > 0:
        start = checkpoint_counters(args.checkpoint).get("synthetic_next", 0)
        synthetic = SyntheticStream(
            [t for _, t in corpus.train],
            args.out / "tokenizer.json",
            args.long_seq,
            args.seed,
            args.workers,
            NeedleMix(args.same_form_share, args.dense_needle_share, args.restate_share),
            start,
        )
        log(f"synthetic: sequences of {args.long_seq + 1} tokens made while training, from row {start:,}")

    model, average, stats = train_model(args, train_ids, synthetic, vocab_size, eos_id, log)
    log(f"trained: {stats}")
    if stats["paused"]:
        return 0
    heldout, heldout_long, recall = evaluation(model, tok, heldout_ids, args, log)
    from kvcore.probes.training import KINDS

    config = mlx_config(args.shape, vocab_size, eos_id, args.export_dtype)
    exported = export(model, args.out, config, args.export_dtype, args.shard_mb)
    averaged = None
    if average.mean is not None:
        average.swap_into(model)
        log(f"tail average of the last {average.n} steps:")
        avg_heldout, avg_long, avg_recall = evaluation(model, tok, heldout_ids, args, log)
        avg_out = args.out / "average"
        avg_out.mkdir(parents=True, exist_ok=True)
        averaged = {
            "steps": average.n,
            "from_progress": args.average_from,
            "heldout": avg_heldout,
            "heldout_long": avg_long,
            "dense_probe_recall": avg_recall,
            "export": export(model, avg_out, config, args.export_dtype, args.shard_mb),
        }
    import torch
    import transformers

    report = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "corpus": {**desc, "packages": installed_packages()},
        "tokens": {"train": int(len(train_ids)), "heldout": int(len(heldout_ids))},
        "tokenizer": {"type": "byte-level BPE", "vocab_size": vocab_size, "eos_id": eos_id},
        "training": {
            **stats,
            **{
                k: getattr(args, k)
                for k in (
                    "batch_size",
                    "seq_len",
                    "long_seq",
                    "long_frac",
                    "shape",
                    "lr",
                    "warmup",
                    "min_lr_frac",
                    "init_from",
                    "same_form_share",
                    "dense_needle_share",
                    "restate_share",
                    "seed",
                    "synthetic_share",
                    "stdlib_weight",
                    "compile",
                )
            },
        },
        "heldout": heldout,
        "heldout_long": heldout_long,
        "dense_probe_recall": recall,
        "tail_average": averaged,
        "synthetic_kinds": KINDS,
        "unigram_baseline": baseline,
        "export": {**exported, "dtype": args.export_dtype},
        "wall_seconds": round(time.time() - t_start, 1),
    }
    (args.out / "train_report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    log(f"done: {json.dumps({k: report[k] for k in ('heldout', 'unigram_baseline', 'export')})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
