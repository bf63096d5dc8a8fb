"""Scoring time of every method against snapkv's, on the same captured prefill (issue 38).

What is timed is `kvcore.methods.selection.rank`: every layer's scores and their ranking, from the observations a
prefill with capture left (h2o sums deferred, pre-RoPE query statistics on), as `Session.ranking` runs it when a
method is first chosen. The model is Llama-3.2-1B's shape with its first layers and random weights in float32
(benchmarks.common.build); the prefill is not timed. Each method is timed best of `--repeats` after one warm-up;
wrappers are timed over snapkv. h2o's column sums are deferred at capture and computed by its first ranking, so
its figure is that first call (fresh capture, one run). Figures and the ratio to snapkv come from one run (the machine is noisy).

    .venv/bin/python -m benchmarks.scoring_time [--contexts 2048 8192] [--layers 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import time

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)

# isort: split
import mlx.core as mx
import numpy as np

from benchmarks.common import build
from kvcore import methods
from kvcore.capture.prefill import prefill_with_capture
from kvcore.defaults import CAPTURE_WINDOW
from kvcore.methods.selection import rank

BASELINE = "snapkv"


def timed_methods() -> list[str]:
    """Every scorer, and every wrapper over snapkv (the wrappers' cost over other scorers adds that scorer's)."""
    names = methods.available()
    return [n for n in names if "-" not in n or n.endswith(f"-{BASELINE}")]


def time_rank(observations: list, name: str, repeats: int) -> float:
    """Best-of-`repeats` ms of ranking every layer with method `name` (after one warm-up)."""
    method = methods.get(name)
    if method.needs_h2o:  # the deferred sums are computed once, by the first ranking: that call is the cost
        return _ms(lambda: rank(observations, method))
    rank(observations, method)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        rank(observations, method)
        best = min(best, (time.perf_counter() - start) * 1e3)
    return best


def _ms(work) -> float:
    start = time.perf_counter()
    work()
    return (time.perf_counter() - start) * 1e3


def capture(model, ids: list[int]):
    """Session.prefill's capture: window CAPTURE_WINDOW, h2o sums deferred, the last token held back."""
    captured = prefill_with_capture(
        model, ids, window=CAPTURE_WINDOW, h2o="lazy", hold_last=True, query_stats=True
    )
    mx.eval([c.keys for c in captured.cache if getattr(c, "keys", None) is not None])
    return captured


class ByteTokenizer:
    """Stands in for a tokenizer where a replay-scored method (kvzip) encodes its fixed prompt: one id per byte,
    so the replay has the length a byte-level tokenizer would give it; no chat template."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())


def time_reconstruction(model, captured, ids: list[int], name: str) -> float:
    """ms of a replay-scored method's first ranking: its forward pass over the context, then the ranking."""
    method = methods.get(name)

    def first_ranking() -> None:
        method.reconstruct(model, ByteTokenizer(), captured, ids, False)
        rank(captured.observations, method)

    return _ms(first_ranking)


def run(
    contexts: list[int], layers: int, repeats: int, only: list[str] | None = None
) -> list[tuple[str, dict[int, float | str]]]:
    model = build("llama-3.2-1b", layers)
    names = [n for n in timed_methods() if not only or n in only or n == BASELINE]
    table: dict[str, dict[int, float | str]] = {n: {} for n in names}
    for T in contexts:
        ids = np.random.default_rng(T).integers(0, 32000, size=T).tolist()
        captured = capture(model, ids)
        for name in names:
            if methods.get(name).needs_h2o:  # fresh: h2o's deferred sums are computed once per capture
                captured = capture(model, ids)
            try:
                if methods.get(name).needs_reconstruction:  # its replay is the cost, once per capture
                    table[name][T] = time_reconstruction(model, captured, ids, name)
                    continue
                table[name][T] = time_rank(captured.observations, name, repeats)
            except ValueError as error:  # a method this capture cannot serve says why
                table[name][T] = f"refused: {error}"
        del captured
    return list(table.items())


def markdown(rows: list[tuple[str, dict[int, float | str]]], contexts: list[int]) -> str:
    base = dict(rows)[BASELINE]
    head = "| method | " + " | ".join(f"{T} tokens (ms) | × snapkv" for T in contexts) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(contexts))]
    for name, cells in rows:
        parts = []
        for T in contexts:
            v, b = cells.get(T), base.get(T)
            if isinstance(v, float) and isinstance(b, float):
                parts += [f"{v:.1f}", f"{v / b:.2f}"]
            else:
                parts += [str(v), ""]
        lines.append(f"| {name} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--layers", type=int, default=2, help="first layers of Llama-3.2-1B's shape")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--methods", nargs="*", default=None, help="only these methods (and snapkv)")
    args = parser.parse_args(argv)
    rows = run(args.contexts, args.layers, args.repeats, args.methods)
    print(f"Llama-3.2-1B shape, {args.layers} layers, float32, best of {args.repeats}")
    print(markdown(rows, args.contexts))


if __name__ == "__main__":
    main()
