"""Every quantization scheme kvcore.quant discovers, on the same prefill against the same dense reference.

Quality: KL(dense ‖ compressed) and top-1 agreement, teacher-forced on the dense greedy continuation, against the
bytes the compressed cache really stores (`cache_tensor_bytes`), at 2, 3 and 4 bits, on the demo model's sample
prompts (resources/prompts) and on a Llama-3.2-1B-shape model with random weights (the first layers, random
prompt ids). Every scheme found is run — a scheme added later appears with no change here — and a scheme with a
choice parameter (rotated's packing) is run once per choice. Widths a scheme does not pack are skipped and the
table says so. Full retention: only quantization differs.

Speed: decode tokens/s of each genuine scheme at 4 bits (its own width where it packs only one) against mlx-lm's
QuantizedKVCache 4-bit (group 64, mlx-lm's attention), on a 4k-token cache of the Llama shape, measured side by
side in one run: cases interleaved round by round, the best round kept (other processes share this CPU).

    .venv/bin/python -m benchmarks.quant_schemes [--tokens 16] [--samples 5] [--context 4096] [--decode 16]
        [--also kivi:residual=32]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)

# isort: split
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from benchmarks.bench_decode import attention_for, decode
from benchmarks.common import build, shape_of, synthetic_cache
from kvcore.cache import sparse as caches
from kvcore.cache.kivi import kivi_cache
from kvcore.engine.session import Session
from kvcore.measure import metrics
from kvcore.model import attention
from kvcore.quant import QuantScheme, available, get
from kvcore.resources import demo_model_dir, prompts_dir
from kvcore.samples import sample_prompts

WIDTHS = (2, 3, 4)
LLAMA = "llama-3.2-1b"


def scheme_specs() -> list[str]:
    """Every discovered scheme, and one spec per value of a choice parameter (rotated:packing=mxfp4, …)."""
    out = []
    for name in available():
        choices = [p for p in get(name).parameters() if p.choices]
        out.append(name)
        for p in choices:
            out += [f"{name}:{p.name}={c}" for i, c in enumerate(p.choices) if i != p.default]
    return out


def scheme_at(spec: str, head_dim: int) -> QuantScheme:
    """The scheme at its own group size, or the largest it allows that divides head_dim."""
    scheme = get(spec)
    if head_dim % scheme.group_size:
        fits = [g for g in scheme.allowed_group_sizes if head_dim % g == 0]
        if fits:
            scheme = get(spec, group_size=max(fits))
    return scheme


def pack(dense: list[Any], scheme: QuantScheme, bits: int) -> list[Any]:
    """The dense cache packed by `scheme` at `bits` (keys and values): KIVI's own cache for a per-channel scheme."""
    if scheme.per_channel_keys:
        return kivi_cache(dense, scheme, bits)
    return caches.quantize_cache(dense, bits=bits, group_size=scheme.group_size, quant=scheme.spec)


def prefill(model: nn.Module, ids: list[int]) -> tuple[list[Any], mx.array]:
    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)
    mx.eval(logits)
    return cache, logits[0, -1]


def forced(model: nn.Module, cache: list[Any], tokens: list[int]) -> np.ndarray:
    """Logits [n, V] of feeding `tokens` at once (teacher forcing)."""
    out = model(mx.array([tokens]), cache=cache)
    mx.eval(out)
    return np.array(out[0].astype(mx.float32))


def evaluate(model: nn.Module, ids: list[int], n_tokens: int, specs: list[str], head_dim: int) -> dict:
    """(spec, bits) -> (KL mean, top-1 agreement, compressed bytes / dense bytes) on one prompt; None: skipped."""
    dense, last = prefill(model, ids)
    tokens = [int(mx.argmax(last))]
    steps = caches.copy_cache(dense)
    for _ in range(n_tokens - 1):  # the dense greedy continuation
        tokens.append(int(np.argmax(forced(model, steps, tokens[-1:])[-1])))
    want = forced(model, caches.copy_cache(dense), tokens[:-1])
    dense_bytes = caches.cache_tensor_bytes(dense)
    out: dict[tuple[str, int], tuple[float, float, float] | None] = {}
    for spec in specs:
        for bits in WIDTHS:
            try:
                scheme = scheme_at(spec, head_dim)
                scheme.check(bits, head_dim)
                packed = pack(caches.copy_cache(dense), scheme, bits)
            except ValueError:
                out[spec, bits] = None
                continue
            stored = caches.cache_tensor_bytes(packed)
            m = metrics.teacher_forced(want, forced(model, packed, tokens[:-1]), np.array(tokens[1:]))
            out[spec, bits] = (m["kl_mean"], m["agreement"], stored / dense_bytes)
    return out


def table(title: str, runs: list[dict], specs: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Markdown: one row per scheme, per width the mean KL, top-1 agreement and % of dense bytes over the prompts;
    returns each scheme's (bytes %, KL) points for the frontier plot."""
    points: dict[str, list[tuple[float, float]]] = {}
    print(f"\n### {title}\n")
    head = " | ".join(f"{b}-bit KL / top-1 / bytes" for b in WIDTHS)
    print(f"| scheme | execution | {head} |")
    print("|---" * (2 + len(WIDTHS)) + "|")
    for spec in specs:
        cells = []
        for bits in WIDTHS:
            got = [r[spec, bits] for r in runs]
            if any(g is None for g in got):
                allowed = get(spec).allowed_bits
                cells.append(f"— (packs {','.join(map(str, allowed))} only)")
                continue
            kl, top1, frac = (float(np.mean(x)) for x in zip(*got, strict=True))
            cells.append(f"{kl:.4f} / {top1:.3f} / {100 * frac:.1f}%")
            points.setdefault(spec, []).append((100 * frac, kl))
        print(f"| {spec} | {get(spec).execution} | {' | '.join(cells)} |")
    return points


def frontier_png(path: str, panels: dict[str, dict[str, list[tuple[float, float]]]]) -> None:
    """KL against stored bytes, one panel per model and one line per scheme (2, 3, 4 bits), as a PNG (pyqtgraph
    offscreen; written to a temp file, then renamed)."""
    import os

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import pyqtgraph as pg
    from pyqtgraph.exporters import ImageExporter
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    win = pg.GraphicsLayoutWidget()
    win.setBackground("w")
    win.resize(1600, 700)
    palette = (
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
        "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#f0a000",
    )  # fmt: skip
    for title, by_spec in panels.items():
        plot = win.addPlot(title=f"<span style='color:#222'>{title}</span>")
        plot.setLogMode(False, True)
        plot.showGrid(x=True, y=True, alpha=0.3)
        plot.setLabel("bottom", "stored bytes, % of the dense cache")
        plot.setLabel("left", "KL(dense ‖ compressed), log")
        for axis in ("left", "bottom"):
            plot.getAxis(axis).enableAutoSIPrefix(False)
        # two columns across the top right: above kivi's points (right) and beside the others (left)
        legend = plot.addLegend(offset=(-5, 5), labelTextColor="k", colCount=2)
        legend.setBrush(pg.mkBrush(255, 255, 255, 230))
        for i, (spec, pts) in enumerate(by_spec.items()):
            pts = sorted(pts)
            colour = palette[i % len(palette)]
            plot.plot(
                [x for x, _ in pts],
                [max(kl, 1e-5) for _, kl in pts],
                pen=pg.mkPen(colour, width=2),
                symbol="o",
                symbolSize=7,
                symbolBrush=colour,
                name=spec,
            )
        kls = [max(kl, 1e-5) for pts in by_spec.values() for _, kl in pts]
        if kls:  # headroom above the data (log axis) for the two-column legend
            plot.setYRange(np.log10(min(kls)) - 0.2, np.log10(max(kls)) + 1.2, padding=0)
    app.processEvents()
    tmp = f"{path}.tmp.png"
    ImageExporter(win.ci).export(tmp)
    os.replace(tmp, path)


def decode_speed(context: int, n_tokens: int, rounds: int, n_layers: int, specs: list[str]) -> None:
    """Decode tok/s of each genuine scheme against mlx-lm's QuantizedKVCache 4-bit, interleaved, best round."""
    model = build(LLAMA, n_layers=n_layers)
    L, H, D = shape_of(model)
    dense = synthetic_cache(L, H, D, context, mx.float32)
    cases: dict[str, tuple[bool, Callable[[], list[Any]]]] = {
        "mlx-lm QuantizedKVCache 4b": (False, lambda: [c.to_quantized(group_size=64, bits=4) for c in dense])
    }
    for spec in specs:
        scheme = scheme_at(spec, D)
        if not scheme.genuine:
            continue
        bits = 4 if 4 in scheme.allowed_bits else scheme.allowed_bits[0]
        cases[f"{spec} {bits}b"] = (True, lambda s=scheme, b=bits: pack(caches.copy_cache(dense), s, b))
    best: dict[str, float] = dict.fromkeys(cases, 0.0)
    for _ in range(rounds):
        for name, (kvcore_side, make) in cases.items():
            cache = make()
            with attention_for(model, kvcore_side):
                best[name] = max(best[name], decode(model, cache, n_tokens))
    base = best["mlx-lm QuantizedKVCache 4b"]
    print(
        f"\n### Decode at {context} tokens, {LLAMA} shape ({L} layers, random weights), float32, this CPU\n"
    )
    print("| cache | tok/s | vs mlx-lm QuantizedKVCache 4b |")
    print("|---|---|---|")
    for name, tps in best.items():
        print(f"| {name} | {tps:.1f} | {tps / base:.2f}× |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=16, help="continuation tokens compared (teacher-forced)")
    p.add_argument("--samples", type=int, default=5, help="demo sample prompts used (from the first)")
    p.add_argument("--random-prompt", type=int, default=512, help="prompt length on the Llama-shape model")
    p.add_argument("--layers", type=int, default=4, help="first layers of the Llama shape kept")
    p.add_argument("--context", type=int, default=4096, help="cache length of the decode benchmark")
    p.add_argument("--decode", type=int, default=16, help="timed decode tokens per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="SPEC",
        help="another scheme spec, e.g. kivi:residual=32",
    )
    p.add_argument("--plot", default="", metavar="FILE.png", help="the KL-against-bytes frontier as a PNG")
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--skip-speed", action="store_true")
    args = p.parse_args(argv)
    specs = scheme_specs() + args.also
    start = time.perf_counter()
    if not args.skip_quality:
        session = Session.load(str(demo_model_dir()))
        attention.install(session.model)
        head_dim = session.info.head_dim
        runs = []
        for sample in sample_prompts(prompts_dir())[: args.samples]:
            ids = session.tokenizer.encode(sample.path.read_text(encoding="utf-8"))
            runs.append(evaluate(session.model, ids, args.tokens, specs, head_dim))
        demo_title = f"Demo model, {len(runs)} sample prompts, {args.tokens} tokens teacher-forced"
        panels = {demo_title: table(demo_title, runs, specs)}
        model = build(LLAMA, n_layers=args.layers)
        attention.install(model)
        ids = np.random.default_rng(0).integers(0, model.args.vocab_size, args.random_prompt).tolist()
        runs = [evaluate(model, ids, args.tokens, specs, shape_of(model)[2])]
        title = f"{LLAMA} shape, first {args.layers} layers, random weights, {args.random_prompt} random ids"
        panels[title] = table(title, runs, specs)
        if args.plot:
            frontier_png(args.plot, panels)
    if not args.skip_speed:
        decode_speed(args.context, args.decode, args.rounds, args.layers, specs)
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
