"""Which methods keep the answer on the demo model: its needle probes and the long-identifier sample, all at 25 %.

Needle probes: the held-out families (never trained on), 600–1,700 tokens, one prefill each, every method
recompressed from it (`kvcore.probes.scoring`, as `benchmarks.probe_sweep`); recall is the share of probes whose
value the compressed cache still completes. Long identifier (resources/prompts/long_identifier.txt): a function name
defined ~590 tokens before its use; the dense continuation writes it, and a method keeps the answer when its own
continuation writes the same name (the characters before the first "("); the KL and agreement against the dense
continuation are Session's. Methods whose artifact is missing (calibrated ones) are listed as refused.
A method may carry parameters, as in the parity harness: `dms-kvzap?threshold=-6.0` (NAME?PARAM=VALUE&...).

    .venv/bin/python -m benchmarks.methods_demo [--probes 20] [--ratio 0.25] [--methods a,b] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)
from benchmarks.probe_sweep import probes
from kvcore import methods
from kvcore.atomic import write_text
from kvcore.engine.session import CompressionConfig, Session
from kvcore.probes.scoring import config_rows, probe_rows, recall_table
from kvcore.resources import demo_model_dir, prompts_dir

IDENTIFIER_TOKENS = 24


def default_methods() -> list[str]:
    """Every method by its bare name, adakv over expected_attention (the leaderboard's) and one chain."""
    bare = [n for n in methods.available() if "-" not in n and n not in ("full", "composed")]
    return [*bare, "adakv-expected_attention", "snapkv+knorm"]


def config(spec: str, ratio: float) -> CompressionConfig:
    """A method spec NAME or NAME?PARAM=VALUE&... at `ratio` (the parity harness's syntax), paper schedule."""
    name, _, query = spec.partition("?")
    params = {k: float(v) if "." in v else int(v) for k, v in (p.split("=") for p in query.split("&") if p)}
    return CompressionConfig(name, ratio, params=params)


def identifier(text: str) -> str:
    """The name a continuation writes: everything before its first "(" (the call), stripped."""
    return text.split("(", 1)[0].strip()


def long_identifier(session: Session, names: list[str], ratio: float) -> dict[str, dict]:
    text = (prompts_dir() / "long_identifier.txt").read_text(encoding="utf-8")
    session.prefill(text, n_tokens=IDENTIFIER_TOKENS)
    dense = identifier(session.tokenizer.decode(session.dense_tokens))
    out = {"dense": {"name": dense, "keeps": True}}
    for name in names:
        try:
            regen = session.regenerate(session.compress(config(name, ratio)))
        except ValueError as error:
            out[name] = {"refused": str(error)}
            continue
        written = identifier(session.tokenizer.decode(regen.tokens))
        m = regen.metrics
        out[name] = {
            "name": written,
            "keeps": written == dense,
            "kl_mean": m.get("kl_mean"),
            "top1_agreement": m.get("agreement"),
            "first_divergence": m.get("first_divergence"),
        }
    return out


def needles(
    session: Session, names: list[str], ratio: float, n: int
) -> tuple[dict[str, float | str], dict[str, float]]:
    """Recall per method spec, and the mean stored share of dense per spec (dms keeps its own count)."""
    rows: list[dict] = []
    refused: dict[str, str] = {}
    for probe in probes(session.tokenizer, n):
        rows += probe_rows(session, probe, [])
        for name in names:
            if name in refused:
                continue
            try:
                new = config_rows(session, probe, [config(name, ratio)])
            except ValueError as error:
                refused[name] = str(error)
                continue
            rows += [{**r, "method": name} for r in new]  # two specs of one method stay apart
    table = {k[0]: v for k, v in recall_table(rows).items() if k[0] == "dense" or k[2] == ratio}
    shares: dict[str, list[float]] = {}
    for r in rows:
        if r["method"] != "dense":
            shares.setdefault(r["method"], []).append(r["compression_ratio"])
    stored = {m: sum(v) / len(v) for m, v in shares.items()}
    return {**table, **{n: f"refused: {why}" for n, why in refused.items()}}, stored


def _shown(name: str) -> str:
    """A written name as one table cell: line breaks as ⏎, no backticks."""
    return name.replace("\n", "⏎").replace("`", "'")[:48]


def table_lines(result: dict, names: list[str]) -> list[str]:
    """The Markdown table: needle recall, whether the long identifier is written, KL, top-1, first divergence."""
    recall, ident = result["needle_recall"], result["long_identifier"]
    lines = [
        f"| method | needle recall ({result['probes']} probes) | long identifier | KL mean | top-1 | first divergence |",
        "|---|---|---|---|---|---|",
    ]
    for name in ["dense", *names]:
        r, li = recall.get(name, ""), ident.get(name, {})
        cell = f"{r:.2f}" if isinstance(r, float) else str(r)[:60]
        if "refused" in li:
            lines.append(f"| {name} | {cell} | refused | | | |")
            continue
        written = f"`{_shown(li.get('name', ''))}`"
        kept = f"writes {written}" if name == "dense" else "kept" if li.get("keeps") else f"lost: {written}"
        kl, agree, first = li.get("kl_mean"), li.get("top1_agreement"), li.get("first_divergence")
        kl_cell = "" if kl is None else f"{kl:.3f}"
        agree_cell = "" if agree is None else f"{agree:.2f}"
        lines.append(
            f"| {name} | {cell} | {kept} | {kl_cell} | {agree_cell} | {'' if first is None else first} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(demo_model_dir()))
    p.add_argument("--probes", type=int, default=20)
    p.add_argument("--ratio", type=float, default=0.25, help="retention (kept share of the prompt)")
    p.add_argument("--methods", default="", help="comma-separated (default: every method)")
    p.add_argument("--out", default="", help="also write the results as JSON")
    args = p.parse_args(argv)
    names = [m for m in args.methods.split(",") if m] or default_methods()
    start = time.perf_counter()
    session = Session.load(args.model)
    ident = long_identifier(session, names, args.ratio)
    recall, stored = needles(session, names, args.ratio, args.probes)
    result = {
        "ratio": args.ratio,
        "probes": args.probes,
        "long_identifier": ident,
        "needle_recall": recall,
        "stored_share": stored,
    }
    result["seconds"] = round(time.perf_counter() - start, 1)
    print("\n".join(table_lines(result, names)))
    print(f"({result['seconds']} s)")
    if args.out:
        write_text(args.out, json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
