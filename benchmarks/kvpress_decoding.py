"""Decoding-time parity with kvpress 0.5.5 (`kvpress_parity --decoding`): KV Lens's side.

`write_ids` runs each decoding policy on the demo model (whole prompt prefilled, nothing evicted before the first
token, as kvpress's DecodingPress only acts on decoding steps) and writes the prompt ids, the tokens it fed and the
positions each (layer, kv-head) kept after every compression. `kvpress_reference.py --decoding` feeds kvpress the
same ids one token at a time under the matching press and records the same; `compare` prints per policy the mean and
worst Jaccard index of the kept sets over every (compression step, layer, kv-head) — the issue's measure, where each
side continues from its own cache, so one difference feeds every later step and layer above — and a same-state
table: only the compressions both sides scored from the same rows in the same stored order (in that layer and the
layers below, at every earlier compression), each difference classified by `_why`.
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
        run = decode_with_policy(session, state, policy, N_TOKENS, keep_scores=True)
        kept = {str(c.step): _lists(c.kept) for c in run.compressions}
        detail = {
            str(c.step): {"held": _lists(c.held), "scores": _lists(c.scores), "order": _lists(c.order)}
            for c in run.compressions
        }
        out.append(
            {
                "name": name,
                "policy": {**args, "interval": INTERVAL},
                "prompt": ids,
                "fed": run.tokens[:-1],
                "kept": kept,
                "detail": detail,
                "agreement": float(
                    np.mean([a == b for a, b in zip(run.tokens, session.dense_tokens, strict=False)])
                ),
            }
        )
        print(
            f"{name}: {len(run.compressions)} compressions, steps {sorted(map(int, kept))[:3]}…", flush=True
        )
    write_text(path, json.dumps(out))


def _lists(layers: list[list[np.ndarray] | None] | None) -> list[list[list[float]] | None] | None:
    return None if layers is None else [None if h is None else [p.tolist() for p in h] for h in layers]


def _jaccard(a: set[int], b: set[int]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def _always_kept(policy: dict[str, Any]) -> int:
    """How many of the newest rows the press keeps whatever their score (kvpress pads them with one value)."""
    return {"snapkv": int(policy.get("window", 64)), "tova": 1}.get(policy["method"], 0)


def _why(ours: dict[str, float], theirs: dict[str, float]) -> tuple[str, float]:
    """Why two rankings of the same rows differ: "tie" when kvpress scores two rows exactly alike and KV Lens
    ranks them apart, "near tie" when a pair is ordered oppositely by the two sides (its gap, relative to the
    score, is within the two frameworks' float disagreement), "unexplained" when no pair is; and the largest
    relative gap of such a pair."""
    positions = sorted(theirs)
    t = np.array([theirs[p] for p in positions], np.float64)
    o = np.array([ours[p] for p in positions], np.float64)
    dt, do = t[:, None] - t[None, :], o[:, None] - o[None, :]
    tied = (dt == 0) != (do == 0)
    opposite = np.sign(dt) * np.sign(do) < 0
    if opposite.any():
        scale = np.maximum(np.abs(t)[:, None], np.abs(t)[None, :])
        return "near tie", float((np.abs(dt) / np.maximum(scale, 1e-30))[opposite].max())
    return ("tie", 0.0) if tied.any() else ("unexplained", float("nan"))


def same_state(entry: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Per (compression, layer, kv-head) scored from the same state on both sides — the same rows in the same
    stored order in this layer and every layer below it at every earlier compression (a layer's new keys and
    window queries are computed through the layers below) —: whether both kept the same rows in the same order,
    and where not, why (`_why`; the newest always-kept rows left out)."""
    skip = _always_kept(entry["policy"])
    counts = {"same_state": 0, "same_set": 0, "identical_state": 0, "tie": 0, "near tie": 0, "unexplained": 0}
    gaps: list[float] = []
    first = None
    diverged: dict[int, int] = {}  # layer -> the first compression step where one of its heads kept otherwise
    for step in sorted(entry["detail"], key=int):
        ours, ref = entry["detail"][step], theirs.get(step)
        if ref is None or ours["order"] is None:
            break
        found = []
        for layer, heads in enumerate(ref["held"]):
            if any(diverged.get(below, int(step)) < int(step) for below in range(layer + 1)):
                continue
            for head, held in enumerate(heads):
                mine = ours["held"][layer][head]
                if sorted(held) != mine:
                    found.append(layer)
                    continue
                counts["same_state"] += 1
                counts["same_set"] += sorted(ref["order"][layer][head]) == sorted(ours["order"][layer][head])
                if ref["order"][layer][head] == ours["order"][layer][head]:
                    counts["identical_state"] += 1
                    continue
                found.append(layer)
                first = first or f"{step}/{layer}/{head}"
                scored = held[: len(held) - skip]
                theirs_scores = dict(zip(held, ref["scores"][layer][head], strict=True))
                ours_scores = dict(zip(mine, ours["scores"][layer][head], strict=True))
                why, gap = _why({p: ours_scores[p] for p in scored}, {p: theirs_scores[p] for p in scored})
                counts[why] += 1
                if why == "near tie":
                    gaps.append(gap)
        for layer in found:
            diverged.setdefault(layer, int(step))
    counts["largest_near_tie_gap"] = max(gaps, default=float("nan"))
    counts["first_difference"] = first or "—"
    return counts


def compare(path: Path, ids_path: Path) -> list[dict[str, Any]]:
    loaded = json.loads(path.read_text())
    reference, details = loaded["kept"], loaded.get("detail", {})
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
        if entry["name"] in details and entry["policy"].get("kvpress_form"):
            rows[-1].update(same_state(entry, details[entry["name"]]))
    return rows


def replay(path: Path, ids_path: Path, states_path: Path) -> list[dict[str, Any]]:
    """Same-state parity on every compression: KV Lens's kvpress form scores exactly what kvpress scored — its keys
    in its stored order and its buffered hidden states, projected by the MLX model's own q_proj and RoPE — and
    keeps a set and an order compared with kvpress's (differences classified by `_why`)."""
    import mlx.core as mx

    from kvcore.engine.decode_scoring import Rescorer
    from kvcore.model.loading import load

    model, _, _ = load(str(ROOT / "resources" / "models" / "kvlens-demo"))
    states = np.load(states_path)
    details = json.loads(path.read_text()).get("detail", {})
    rows = []
    for entry in json.loads(ids_path.read_text()):
        policy, name = entry["policy"], entry["name"]
        if not policy.get("kvpress_form") or name not in details:
            continue
        skip = _always_kept(policy)
        counts = {"tie": 0, "near tie": 0, "unexplained": 0}
        jaccards, same_order, gaps = [], 0, []
        for step, ref in sorted(details[name].items(), key=lambda item: int(item[0])):
            for layer, held in enumerate(ref["held"]):
                attn = model.layers[layer].self_attn
                keys = states[f"{name}/{step}/{layer}/keys"]  # [H_kv, n, D], kvpress's stored order
                hidden = states[f"{name}/{step}/{layer}/hidden"]  # [buffer, hidden size]
                rescorer = Rescorer(
                    policy["method"], [], window=policy.get("window"), rope_of=lambda i, a=attn: a.rope
                )
                by_position = [np.argsort(h) for h in held]
                positions = [np.array(h)[o] for h, o in zip(held, by_position, strict=True)]
                stored = np.stack([k[o] for k, o in zip(keys, by_position, strict=True)])
                for head, h in enumerate(held):
                    rescorer.kvpress_order[layer, head] = np.array(h)
                newest, n_buffer = int(max(held[0])), hidden.shape[0]
                q = attn.q_proj(mx.array(hidden)[None])
                q = q.reshape(1, n_buffer, -1, keys.shape[-1]).transpose(0, 2, 1, 3)
                q = attn.rope(q, offset=newest - n_buffer + 1)[
                    0
                ]  # each at its own position, as KV Lens records
                layer_rows = _Stored(mx.array(stored[None]))
                target = len(ref["order"][layer][0])
                rescorer.keep_rows(layer, layer_rows, positions, q, target, attn.scale)
                for head, h in enumerate(held):
                    ours, theirs = rescorer.kvpress_order[layer, head].tolist(), ref["order"][layer][head]
                    jaccards.append(_jaccard(set(ours), set(theirs)))
                    if ours == theirs:
                        same_order += 1
                        continue
                    scored = h[: len(h) - skip]
                    mine = dict(
                        zip(positions[head].tolist(), rescorer.last_scores[head].tolist(), strict=True)
                    )
                    kvpress_scores = dict(zip(h, ref["scores"][layer][head], strict=True))
                    why, gap = _why({p: mine[p] for p in scored}, {p: kvpress_scores[p] for p in scored})
                    counts[why] += 1
                    if why == "near tie":
                        gaps.append(gap)
        j = np.array(jaccards)
        rows.append(
            {
                "policy": name,
                "compared": j.size,
                "mean_jaccard": float(j.mean()),
                "worst_jaccard": float(j.min()),
                "identical": int((j == 1).sum()),
                "same_order": same_order,
                **counts,
                "largest_near_tie_gap": max(gaps, default=float("nan")),
            }
        )
    return rows


class _Stored:
    """A plain layer holding rows [1, H_kv, n, D] (keys; values alike: no replayed method reads them)."""

    def __init__(self, keys: Any) -> None:
        self.keys = self.values = keys
        self.offset = keys.shape[2]


def print_replay(rows: list[dict[str, Any]]) -> None:
    print(
        "| policy | (step, layer, head) replayed | mean Jaccard | worst | same kept set | same set and order | "
        "differing: exact ties | near ties (largest relative gap) | unexplained |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['policy']} | {r['compared']} | {r['mean_jaccard']:.4f} | {r['worst_jaccard']:.4f} | "
            f"{r['identical']} | {r['same_order']} | {r['tie']} | {r['near tie']} "
            f"({r['largest_near_tie_gap']:.1e}) | {r['unexplained']} |"
        )


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
    print()
    print(
        "| policy | (step, layer, head) from the same state | same kept set | same set and order | differing: exact "
        "ties | near ties (largest relative gap) | unexplained | first difference (step/layer/head) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "same_state" in r:
            print(
                f"| {r['policy']} | {r['same_state']} | {r['same_set']} | {r['identical_state']} | {r['tie']} | "
                f"{r['near tie']} "
                f"({r['largest_near_tie_gap']:.1e}) | {r['unexplained']} | {r['first_difference']} |"
            )
