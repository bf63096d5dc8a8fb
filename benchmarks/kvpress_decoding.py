"""Decoding-time parity with kvpress 0.5.5 (`kvpress_parity --decoding`): KV Lens's side.

`write_ids` runs each decoding policy on the demo model (whole prompt prefilled, nothing evicted before the first
token, as kvpress's DecodingPress only acts on decoding steps) and writes the prompt ids, the tokens it fed and the
positions each (layer, kv-head) kept after every compression. `kvpress_reference.py --decoding` feeds kvpress the
same ids one token at a time under the matching press and records the same; `compare` prints per policy the mean and
worst Jaccard index of the kept sets over every (compression step, layer, kv-head).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import ROOT
from kvcore.atomic import write_text

PROMPT = "needle_in_code"
N_TOKENS = 160
INTERVAL = 16
BUDGET = 256
#: name -> (KV Lens DecodingPolicy arguments, the kvpress press kvpress_reference.py builds)
POLICIES: dict[str, dict[str, Any]] = {
    "snapkv": {"method": "snapkv", "budget": BUDGET, "window": 8, "kvpress_form": True},
    "knorm": {"method": "knorm", "budget": BUDGET, "kvpress_form": True},
    "tova": {"method": "tova", "budget": BUDGET, "kvpress_form": True},
    "knorm-ratio": {"method": "knorm", "ratio": 0.25, "kvpress_form": True},
    "snapkv-ratio": {"method": "snapkv", "ratio": 0.25, "window": 8, "kvpress_form": True},
    "snapkv-own-rope": {"method": "snapkv", "budget": BUDGET, "window": 8},
}


def write_ids(path: Path, names: list[str]) -> None:
    from kvcore.engine.decoding import DecodingPolicy, decode_with_policy
    from kvcore.engine.session import CompressionConfig, Session

    session = Session.load(str(ROOT / "resources" / "models" / "kvlens-demo"))
    ids = list(session.tokenizer.encode((ROOT / "resources" / "prompts" / f"{PROMPT}.txt").read_text()))
    session.prefill(ids, N_TOKENS, chat_template=False)
    state = session.compress(CompressionConfig("full", 1.0, schedule="paper"))
    out = []
    for name in names:
        args = POLICIES[name]
        policy = DecodingPolicy(interval=INTERVAL, evict_before_decoding=False, **args)
        run = decode_with_policy(session, state, policy, N_TOKENS)
        kept = {
            str(c.step): [None if h is None else [p.tolist() for p in h] for h in c.kept]
            for c in run.compressions
        }
        out.append(
            {
                "name": name,
                "policy": {**args, "interval": INTERVAL},
                "prompt": ids,
                "fed": run.tokens[:-1],
                "kept": kept,
                "agreement": float(
                    np.mean([a == b for a, b in zip(run.tokens, session.dense_tokens, strict=False)])
                ),
            }
        )
        print(
            f"{name}: {len(run.compressions)} compressions, steps {sorted(map(int, kept))[:3]}…", flush=True
        )
    write_text(path, json.dumps(out))


def _jaccard(a: set[int], b: set[int]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def compare(path: Path, ids_path: Path) -> list[dict[str, Any]]:
    reference = json.loads(path.read_text())["kept"]
    rows = []
    for entry in json.loads(ids_path.read_text()):
        theirs_steps = reference.get(entry["name"])
        if theirs_steps is None:
            continue
        values, steps = [], sorted(set(entry["kept"]) | set(theirs_steps), key=int)
        missing = [s for s in steps if s not in entry["kept"] or s not in theirs_steps]
        for step in steps:
            if step in missing:
                continue
            for ours_layer, theirs_layer in zip(entry["kept"][step], theirs_steps[step], strict=True):
                for ours, theirs in zip(ours_layer, theirs_layer, strict=True):
                    values.append(_jaccard(set(ours), set(theirs)))
        j = np.array(values)
        rows.append(
            {
                "policy": entry["name"],
                "steps": len(steps) - len(missing),
                "missing_steps": ",".join(missing),
                "mean_jaccard": float(j.mean()) if j.size else float("nan"),
                "worst_jaccard": float(j.min()) if j.size else float("nan"),
                "identical": f"{int((j == 1).sum())}/{j.size}",
            }
        )
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(
        "| policy | compressions compared | mean Jaccard | worst | identical (step, layer, head) | steps only one side has |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['policy']} | {r['steps']} | {r['mean_jaccard']:.4f} | {r['worst_jaccard']:.4f} | "
            f"{r['identical']} | {r['missing_steps'] or '—'} |"
        )
