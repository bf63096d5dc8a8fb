"""KL(dense ‖ compressed) of split K/V widths and the float residual on the demo model's sample prompts.

Full retention (method `full`), so only quantization differs; group 64; the mean KL over the continuation,
teacher-forced on the dense greedy tokens. One prefill per prompt serves every configuration.

    .venv/bin/python -m benchmarks.split_bits_kl [--tokens 32] [--fp-recent 64]
"""

from __future__ import annotations

import argparse

from kvcore.engine.session import CompressionConfig, Session
from kvcore.resources import demo_model_dir, prompts_dir
from kvcore.samples import sample_prompts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--fp-recent", type=int, default=64)
    args = p.parse_args(argv)
    configs = {
        "K8/V8": CompressionConfig("full", 1.0, bits=8),
        "K8/V4": CompressionConfig("full", 1.0, bits=8, value_bits=4),
        "K4/V8": CompressionConfig("full", 1.0, bits=4, value_bits=8),
        "K4/V4": CompressionConfig("full", 1.0, bits=4),
        f"K4/V4 fp{args.fp_recent}": CompressionConfig("full", 1.0, bits=4, fp_recent=args.fp_recent),
        "K16/V4": CompressionConfig("full", 1.0, bits=None, value_bits=4),
        "K4/V16": CompressionConfig("full", 1.0, bits=4, value_bits=16),
    }
    session = Session.load(str(demo_model_dir()))
    print(f"{'prompt':<18} {'tokens':>6} " + " ".join(f"{name:>12}" for name in configs))
    for sample in sample_prompts(prompts_dir()):
        name = sample.path.stem
        session.prefill(sample.path.read_text(encoding="utf-8"), n_tokens=args.tokens)
        kl, pct = [], []
        for cfg in configs.values():
            state = session.compress(cfg)
            kl.append(session.regenerate(state).metrics["kl_mean"])
            pct.append(100 * state.bytes_compressed / state.bytes_dense)
        print(f"{name:<18} {len(session.prompt_ids):>6} " + " ".join(f"{v:>12.4f}" for v in kl))
        print(f"{'  % of dense':<18} {'':>6} " + " ".join(f"{v:>11.1f}%" for v in pct))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
