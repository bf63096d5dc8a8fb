"""Held-out code figures of exported models, measured as the app runs them (MLX; float32 on the CPU).

The training script measures top-1 and NLL under PyTorch's bf16 autocast on the GPU; the app loads the same
weights through ``kvcore.model.loading`` (upcast to float32 on MLX's CPU backend). This script reads the same held-out
standard-library files (``HELDOUT`` of the training script) from a stdlib folder, encodes them the same way
(each file followed by EOS) and scores non-overlapping windows, so figures from either side compare::

    python scripts/heldout_top1.py resources/models/kvlens-demo /tmp/other-model --root /usr/lib/python3.12
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvcore.model import loading  # noqa: E402  (loads the optimized BLAS before mlx)

# isort: split
import mlx.core as mx  # noqa: E402

from scripts.train_demo_model import EOS, HELDOUT  # noqa: E402


def heldout_ids(tokenizer, root: Path) -> np.ndarray:
    """The held-out files' ids in HELDOUT order, each followed by EOS (the training script's `encode`)."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    parts: list[int] = []
    for rel in HELDOUT:
        parts += tokenizer.encode((root / rel).read_text(encoding="utf-8"), add_special_tokens=False)
        parts.append(eos)
    return np.asarray(parts, dtype=np.int64)


def score(model, ids: np.ndarray, seq: int, batch: int = 8) -> dict:
    """Top-1 and mean NLL per token over non-overlapping `seq`-token windows."""
    n = (len(ids) - 1) // seq
    inputs = ids[: n * seq].reshape(n, seq)
    targets = ids[1 : n * seq + 1].reshape(n, seq)
    hits = 0
    nll = 0.0
    for i in range(0, n, batch):
        logits = model(mx.array(inputs[i : i + batch])).astype(mx.float32)
        tgt = mx.array(targets[i : i + batch])
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        picked = mx.take_along_axis(logp, tgt[..., None], axis=-1)
        hits += int((logits.argmax(-1) == tgt).sum().item())
        nll -= float(picked.sum().item())
    return {"seq_len": seq, "tokens": n * seq, "top1": hits / (n * seq), "nll_per_token": nll / (n * seq)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="model folders (or anything kvcore.model.loading.load accepts)")
    p.add_argument("--root", type=Path, default=Path(sysconfig.get_paths()["stdlib"]), help="stdlib folder")
    p.add_argument("--seq", type=int, nargs="+", default=[1024])
    args = p.parse_args(argv)
    for spec in args.models:
        model, tokenizer, _ = loading.load(spec)
        ids = heldout_ids(tokenizer, args.root)
        for seq in args.seq:
            print(json.dumps({"model": spec, "root": str(args.root), **score(model, ids, seq)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
