"""Slider path vs. starting over: recompress from stored scores against a full re-prefill, side by side.

Recompress = Session.compress at a new ratio (top-n slice + gather [+ quantize]); re-prefill = what a tool without
stored scores would do: prefill with capture again, then score and compress. Same process, same prompt.
Run: .venv/bin/python -m benchmarks.recompress_vs_prefill [--model PATH] [--prompt-file F] [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import kvcore  # noqa: F401  (optimized BLAS before mlx)
from kvcore.engine.session import CompressionConfig, Session
from kvcore.resources import demo_model_dir, prompts_dir


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(demo_model_dir()))
    p.add_argument("--prompt-file", default=str(prompts_dir() / "long_identifier.txt"))
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    session = Session.load(args.model)
    with open(args.prompt_file, encoding="utf-8") as f:
        session.prefill(f.read(), n_tokens=1)
    T = session.n_compressible()
    print(
        f"model {session.info.name}: {session.info.n_layers} layers x {session.info.n_kv_heads} kv-heads, T={T}"
    )
    print(f"{'method':<10} {'bits':>4} {'recompress ms':>14} {'re-prefill ms':>14} {'ratio':>7}")
    for method, bits in (("snapkv", None), ("snapkv", 4), ("h2o", None), ("adakv", 4)):
        ratios = iter([0.1, 0.2, 0.3, 0.4, 0.5] * (args.repeats + 1))
        session.compress(
            CompressionConfig(method, 0.25, bits=bits)
        )  # ranking computed once, as after a prefill
        calls = session.forward_calls
        recompress = _median_ms(
            lambda m=method, b=bits, r=ratios: session.compress(CompressionConfig(m, next(r), bits=b)),
            args.repeats,
        )
        assert session.forward_calls == calls, "recompress ran the model"

        def redo(m=method, b=bits) -> None:
            fresh = Session(session.model, session.tokenizer, session.info)
            fresh.prefill(session.prompt_ids, n_tokens=1)
            fresh.compress(CompressionConfig(m, 0.3, bits=b))

        reprefill = _median_ms(redo, max(1, args.repeats // 2))
        print(
            f"{method:<10} {bits or 16:>4} {recompress:14.1f} {reprefill:14.1f} {reprefill / recompress:6.0f}x"
        )


if __name__ == "__main__":
    main()
