"""Interpolate two exported models of one shape in weight space: (1 - w) * A + w * B, written as a model folder.

Why: a continuation that trains one ability (retrieval) drifts away from what the model it started from did
better (code); the weights between the two keep most of both (WiSE-FT, Wortsman et al., 2022: "Robust
fine-tuning of zero-shot models"). The demo model is such a point (TRAINING.md). Tokenizer, config and shard
layout come from B; every tensor must match in name, shape and dtype. Files are written atomically::

    python scripts/interpolate_models.py /tmp/base /tmp/continued --weight 0.5 --out /tmp/mixed
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvcore import atomic  # noqa: E402  (loads the optimized BLAS before mlx)

# isort: split
import mlx.core as mx  # noqa: E402


def interpolate(a: Path, b: Path, weight: float, out: Path) -> list[str]:
    """Write (1 - weight) * a + weight * b to `out` in b's layout; returns the shard names written."""
    shards = sorted(b.glob("model*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{b}: no model*.safetensors")
    a_weights: dict[str, mx.array] = {}
    for shard in sorted(a.glob("model*.safetensors")):
        a_weights.update(mx.load(str(shard)))
    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    for shard in shards:
        mixed = {}
        for name, tb in mx.load(str(shard)).items():
            ta = a_weights.get(name)
            if ta is None or ta.shape != tb.shape or ta.dtype != tb.dtype:
                got = "missing" if ta is None else f"{ta.shape} {ta.dtype}"
                raise ValueError(f"{name}: {a} and {b} are not one shape ({got} vs {tb.shape} {tb.dtype})")
            mixed[name] = ((1 - weight) * ta.astype(mx.float32) + weight * tb.astype(mx.float32)).astype(
                tb.dtype
            )
            seen.add(name)
        atomic.write_stream(
            out / shard.name, lambda fh, m=mixed: mx.save_safetensors(fh, m, {"format": "pt"})
        )
    if missing := set(a_weights) - seen:
        raise ValueError(f"{b} lacks {sorted(missing)[:3]} of {a}")
    if out.resolve() != b.resolve():
        for extra in b.iterdir():
            if extra.suffix == ".json" and extra.name.startswith(("config", "tokenizer", "model.")):
                shutil.copyfile(extra, out / extra.name)
    return [s.name for s in shards]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="model folder A (weight 1 - w)")
    p.add_argument(
        "b", type=Path, help="model folder B (weight w); its tokenizer, config and layout are kept"
    )
    p.add_argument("--weight", type=float, required=True, help="w, B's share in [0, 1]")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not 0 <= args.weight <= 1:
        p.error(f"--weight is B's share in [0, 1], not {args.weight}")
    names = interpolate(args.a, args.b, args.weight, args.out)
    print(f"wrote {len(names)} shards to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
