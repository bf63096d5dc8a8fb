"""Parity with NVIDIA kvpress 0.5.5: per method, how far KV Lens's kept positions are from kvpress's own presses.

Two halves, so kvpress (PyTorch) never has to live beside MLX:
1. `python -m benchmarks.kvpress_parity --write-ids ids.json` tokenizes the demo model's sample prompts and writes
   their ids under both schedules ("paper": the whole prompt; "mlx-lm": all but its last token).
2. `python benchmarks/kvpress_reference.py --ids ids.json --model resources/models/kvlens-demo --out kept.json`
   runs kvpress where PyTorch is (a GPU machine, or a CPU venv as DESIGN.md says).
3. `python -m benchmarks.kvpress_parity --compare kept.json` runs KV Lens on the same ids and prints, per method,
   the mean and worst per-(layer, kv-head) Jaccard index of the kept sets, and where they differ whether the
   counts differ (kvpress keeps int(T·r); KV Lens rounds r·T half up) or the sets differ at equal counts (then the
   largest score gap across the boundary says whether it is a tie).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)

# isort: split
import numpy as np

from benchmarks.common import ROOT
from kvcore.atomic import write_text

PROMPTS = ("dict_lookup", "needle_in_code", "long_identifier")
#: Parameters KV Lens runs a method with, the same values kvpress_reference.py gives its press.
PARAMS: dict[str, dict[str, Any]] = {
    "chunk-keydiff": {"chunk_length": 256},
    "simlayerkv": {"lazy_threshold": 0.6, "n_recent": 256},
    "dms": {"threshold": 0.001},
    "kvcompose@unstructured": {"structured": 0},  # NAME@VARIANT runs NAME with these parameters
    "dms-kvzap": {"threshold": -6.0},  # kvpress_reference.KVZAP_THRESHOLD: on the surrogate's log-score
}


def lukv_curve(n_layers: int, n_kv_heads: int) -> list[float]:
    """lukv's parity curve (kvpress ships one for Llama-3.1-8B only), flattened [99, L, H_kv]: at compression c the
    (layer, head) slots prune c·(0.5 + s/(L·H − 1)) for slot s (mean c), at most 0.99; kvpress_reference.py sets
    the same array as its press's curve."""
    slots = n_layers * n_kv_heads
    return [min(0.99, (t + 1) / 100 * (0.5 + s / (slots - 1))) for t in range(99) for s in range(slots)]


def _params(method: str, ratio: float, n_layers: int) -> dict[str, Any]:
    """PARAMS, and per_layer_compression's ratios as kvpress_reference.layer_ratios sets them (mean r)."""
    if method.startswith("per_layer_compression"):
        return {"layer_ratios": tuple(ratio * (0.5 + layer / (n_layers - 1)) for layer in range(n_layers))}
    if method == "lukv":  # kvpress's default inner: ExpectedAttentionPress(epsilon=2e-2)
        config = json.loads((ROOT / "resources" / "models" / "kvlens-demo" / "config.json").read_text())
        return {
            "attention_epsilon": 0.02,
            "curve": tuple(lukv_curve(n_layers, config["num_key_value_heads"])),
        }
    return PARAMS.get(method, {})


def write_ids(path: Path) -> None:
    from kvcore.model.loading import load

    _, tokenizer, _ = load(str(ROOT / "resources" / "models" / "kvlens-demo"))
    prompts = []
    for name in PROMPTS:
        ids = list(tokenizer.encode((ROOT / "resources" / "prompts" / f"{name}.txt").read_text()))
        prompts.append({"name": name, "ids": {"paper": ids, "mlx-lm": ids[:-1]}})
    write_text(path, json.dumps(prompts))
    sizes = ", ".join(f"{p['name']} ({len(p['ids']['paper'])} tokens)" for p in prompts)
    print(f"wrote {path}: {sizes}")


def _jaccard(a: set[int], b: set[int]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def compare(path: Path, ids_path: Path) -> list[dict[str, Any]]:
    """One row per (method, schedule, ratio): mean and worst Jaccard, and why the sets differ where they do."""
    from kvcore.engine.session import CompressionConfig, Session

    reference = json.loads(path.read_text())
    prompts = {p["name"]: p for p in json.loads(ids_path.read_text())}
    session = Session.load(str(ROOT / "resources" / "models" / "kvlens-demo"))
    groups: dict[tuple[str, str, float], list[tuple[float, str]]] = {}
    by_prompt: dict[str, list[tuple[str, str, float, Any]]] = {}
    channel_rows: dict[tuple[str, str, float], list[bool]] = {}
    value_gaps: dict[tuple[str, str, float], float] = {}
    for key, kept in reference["kept"].items():
        method, name, schedule, ratio = key.split("|")
        by_prompt.setdefault(name, []).append((method, schedule, float(ratio), kept))
    for name, entries in by_prompt.items():
        session.prefill(prompts[name]["ids"]["paper"], 1, chat_template=False)
        # h2o's sums free the prompt queries that non_causal_attention and compactor read: h2o's methods last.
        entries.sort(key=lambda entry: "h2o" in entry[0])
        for method, schedule, ratio, theirs in entries:
            key, _, query = method.partition("?")  # NAME?PARAM=VALUE&...: with these parameters
            params = {
                **_params(key, ratio, len(theirs)),
                **{
                    k: float(v) if "." in v else int(v)
                    for k, v in (p.split("=") for p in query.split("&") if p)
                },
            }
            config = CompressionConfig(key.split("@")[0], ratio, schedule=schedule, params=params)
            state = session.compress(config)
            scores = session.ranking(state.config).layers
            their_sums = reference.get("value_sums", {}).get(f"{method}|{name}|{schedule}|{ratio}")
            if their_sums is not None:  # merging: the kept values' sum per head, relative difference
                for layer, heads in enumerate(their_sums):
                    _, stored = state.cache[layer].keys_and_values()
                    counts = state.cache[layer].kept_counts
                    for head, want in enumerate(heads):
                        got = np.array(stored[0, head, : counts[head]]).sum(axis=0)
                        gap = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))
                        value_gaps[(method, schedule, ratio)] = max(
                            value_gaps.get((method, schedule, ratio), 0), gap
                        )
            their_channels = reference.get("channels", {}).get(f"{method}|{name}|{schedule}|{ratio}")
            if their_channels is not None:  # think: the key channels each head stores
                ours_channels = Session.kept_channels(state)
                same = [
                    ours_channels[layer] is not None and ours_channels[layer][head].tolist() == heads[head]
                    for layer, heads in enumerate(their_channels)
                    for head in range(len(heads))
                ]
                channel_rows[(method, schedule, ratio)] = (
                    channel_rows.get((method, schedule, ratio), []) + same
                )
            for layer, heads in enumerate(theirs):
                for head, positions in enumerate(heads):
                    ours = set(np.flatnonzero(state.kept[layer, head]).tolist())
                    theirs_set = set(positions)
                    why = ""
                    if ours != theirs_set:
                        if len(ours) != len(theirs_set):
                            why = f"count {len(ours)} vs {len(theirs_set)}"
                        else:
                            row = scores[layer].scores[head] if scores[layer] is not None else None
                            only_ours, only_theirs = ours - theirs_set, theirs_set - ours
                            gap = (
                                float(
                                    np.max(
                                        np.abs(row[list(only_ours)][:, None] - row[list(only_theirs)][None])
                                    )
                                )
                                if row is not None
                                else float("nan")
                            )
                            why = f"{len(only_ours)} swapped, score gap {gap:.2e}"
                    groups.setdefault((method, schedule, ratio), []).append((_jaccard(ours, theirs_set), why))
    rows = []
    for (method, schedule, ratio), values in sorted(groups.items()):
        jaccards = np.array([j for j, _ in values])
        reasons = sorted({w for _, w in values if w})
        rows.append(
            {
                "method": method,
                "schedule": schedule,
                "ratio": ratio,
                "mean_jaccard": float(jaccards.mean()),
                "worst_jaccard": float(jaccards.min()),
                "identical_heads": f"{int((jaccards == 1).sum())}/{len(jaccards)}",
                "differences": "; ".join(reasons[:3]) + (" …" if len(reasons) > 3 else ""),
            }
        )
        same = channel_rows.get((method, schedule, ratio))
        if same is not None:
            rows[-1]["differences"] += f" key channels identical in {sum(same)}/{len(same)} heads"
        gap = value_gaps.get((method, schedule, ratio))
        if gap is not None:
            rows[-1]["differences"] += f" merged values: largest relative gap of a head's value sum {gap:.1e}"
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write-ids", type=Path, help="write the prompts' token ids for kvpress_reference.py")
    p.add_argument("--compare", type=Path, help="kvpress_reference.py's output")
    p.add_argument("--ids", type=Path, default=Path("ids.json"), help="the ids file the reference ran on")
    p.add_argument(
        "--decoding",
        default="",
        help="decoding-time parity (benchmarks.kvpress_decoding): comma-separated policies, or 'all'",
    )
    p.add_argument(
        "--replay",
        type=Path,
        help="with --decoding --compare: the reference's --states .npz; also score kvpress's own state at every "
        "compression in KV Lens (same-state parity)",
    )
    args = p.parse_args(argv)
    if args.decoding:
        from benchmarks import kvpress_decoding

        names = list(kvpress_decoding.POLICIES) if args.decoding == "all" else args.decoding.split(",")
        if args.write_ids:
            kvpress_decoding.write_ids(args.write_ids, names)
        elif args.compare:
            kvpress_decoding.print_rows(kvpress_decoding.compare(args.compare, args.ids))
            if args.replay:
                print()
                kvpress_decoding.print_replay(kvpress_decoding.replay(args.compare, args.ids, args.replay))
        else:
            p.error("give --write-ids FILE or --compare FILE")
        return 0
    if args.write_ids:
        write_ids(args.write_ids)
        return 0
    if not args.compare:
        p.error("give --write-ids FILE or --compare FILE")
    rows = compare(args.compare, args.ids)
    print("| method | schedule | r | mean Jaccard | worst | identical heads | where they differ |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['method']} | {r['schedule']} | {r['ratio']} | {r['mean_jaccard']:.4f} | "
            f"{r['worst_jaccard']:.4f} | {r['identical_heads']} | {r['differences']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
