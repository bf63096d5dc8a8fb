"""`kvlens calibrate kvzap`'s work: collect (attention input, kvzip+ score) rows from the user's prompts, then train
kvzap's surrogate on them with MLX.

1. Collect, per prompt not yet in a shard (`kvcore.methods.kvzap_shards`, written after each, so a stopped run
   resumes): prefill it with each layer's attention input tapped, keeping the rows of a seeded sample of positions
   (`KVZAP_POSITIONS`); run kvzip's reconstruction with the KVzip+ normalisation (kvpress's training target: the
   max over the repeated context's queries of attention / ‖attention input‖ × ‖W_o·v‖); the target of a row is
   log(max(score, KVZAP_SCORE_FLOOR)) per kv-head, as kvpress's training script takes the log of KVzip+.
2. Train (`kvcore.methods.kvzap_training`) from the shards of the given prompts, holding out a tenth of the prompts
   (at least one when there are two or more; chosen by a hash of their ids), and write the surrogate with its
   figures: held-out MSE and R², and the Jaccard index of the kept sets against kvzip+'s at 25 % and 50 % (per
   held-out prompt, layer and kv-head: the top share of its sampled positions by each score).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from kvcore.capture import attention_input
from kvcore.capture.prefill import prefill_with_capture
from kvcore.defaults import KVZAP_HELD_OUT, KVZAP_POSITIONS, KVZAP_SCORE_FLOOR, KVZAP_VERSION
from kvcore.engine.session import Session
from kvcore.methods import calibration, kvzap_shards, kvzap_surrogate
from kvcore.methods.kvzap_training import TrainingOutcome, TrainingSettings, predict, train
from kvcore.methods.kvzip import KVzip
from kvcore.model import prompting

#: The kept shares the Jaccard figures are measured at.
JACCARD_RATIOS = (0.25, 0.5)


@dataclass(frozen=True)
class KVzapOutcome:
    path: Path
    surrogate: kvzap_surrogate.Surrogate
    collected: int  # prompts collected by this run
    skipped: int  # prompts whose shard was already there (resume)
    training: TrainingOutcome


def collect(session: Session, prompt_id: str, text: str, positions: int, seed: int) -> kvzap_shards.Shard:
    """One prompt's shard: sampled attention-input rows and their log kvzip+ targets, per observed layer."""
    ids, _ = prompting.encode_prompt(session.tokenizer, text, False, None)
    keep = kvzap_shards.sample_positions(prompt_id, len(ids), positions, seed)
    seen_rows: dict[int, int] = {}
    kept: dict[int, list[mx.array]] = {}

    def seen(layer: int, x: mx.array) -> None:
        start = seen_rows.get(layer, 0)
        seen_rows[layer] = start + x.shape[0]
        inside = keep[(keep >= start) & (keep < start + x.shape[0])] - start
        if inside.size:
            rows = x[mx.array(inside)].astype(mx.float32)
            mx.async_eval(rows)
            kept.setdefault(layer, []).append(rows)

    with attention_input.tapped(session.model, seen):
        capture = prefill_with_capture(session.model, ids, window=1, h2o=False, query_stats=False)
    scorer = KVzip(kvzip_plus_normalization=1)
    scorer.reconstruct(session.model, session.tokenizer, capture, ids, False)
    rows, targets = {}, {}
    for layer, obs in enumerate(capture.observations):
        if obs is None or layer not in kept:
            continue
        scores = np.array(obs.reconstruction[scorer.reconstruction_key], np.float64)[:, keep]  # [H_kv, n]
        rows[layer] = np.array(mx.concatenate(kept[layer], axis=0))
        # float32 as the shard stores them: a run that collects trains on what a resumed run reads
        targets[layer] = np.log(np.maximum(scores, KVZAP_SCORE_FLOOR)).T.astype(np.float32)
    if not rows:
        raise ValueError("kvzap: no layer of this model is a plain attention layer KV Lens can observe")
    return kvzap_shards.Shard(prompt_id, len(ids), _settings(positions, seed), keep, rows, targets)


def _settings(positions: int, seed: int) -> dict:
    return {"positions": positions, "seed": seed, "target": f"log(max(kvzip+, {KVZAP_SCORE_FLOOR:g}))"}


def held_out_ids(prompt_ids: Sequence[str]) -> set[str]:
    """A tenth of the prompts (at least one of two or more), by a hash of their ids: independent of their order."""
    if len(prompt_ids) < 2:
        return set()
    n = max(1, round(len(prompt_ids) * KVZAP_HELD_OUT))
    return set(sorted(prompt_ids, key=kvzap_shards.id_order)[:n])


def _stack(shards: list[kvzap_shards.Shard], layers: list[int]) -> tuple[np.ndarray, np.ndarray]:
    x = np.stack([np.concatenate([s.rows[i] for s in shards]) for i in layers])
    y = np.stack([np.concatenate([s.targets[i] for s in shards]) for i in layers])
    return x, y


def jaccard_against_kvzip(
    model_type: str, weights: list, shards: list[kvzap_shards.Shard], layers: list[int], ratio: float
) -> float:
    """Mean Jaccard index of the top `ratio` of each shard's sampled positions by the surrogate and by kvzip+,
    per layer and kv-head (ties broken by position, as selection does)."""
    values = []
    for shard in shards:
        x, y = _stack([shard], layers)
        pred = predict(model_type, weights, x)
        n = max(1, int(x.shape[1] * ratio))
        for li in range(len(layers)):
            for h in range(y.shape[-1]):
                ours = set(np.argsort(-pred[li, :, h], kind="stable")[:n].tolist())
                theirs = set(np.argsort(-y[li, :, h], kind="stable")[:n].tolist())
                values.append(len(ours & theirs) / len(ours | theirs))
    return float(np.mean(values)) if values else float("nan")


def calibrate_kvzap(
    session: Session,
    prompts: Sequence[tuple[str, str]],
    settings: TrainingSettings | None = None,
    positions: int = KVZAP_POSITIONS,
    out: Path | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
    on_epoch: Callable[[int, int, float, float | None, float | None], None] | None = None,
) -> KVzapOutcome:
    """Collect what is missing, train, write the surrogate (module docstring); returns where and what."""
    settings = settings or TrainingSettings()
    settings.check()
    if positions < 1:
        raise ValueError(f"--kvzap-positions must be an integer >= 1, got {positions!r}")
    if not prompts:
        raise ValueError("kvzap calibration needs at least one prompt")
    fingerprint = calibration.model_key(session.info.path)
    folder = kvzap_shards.shard_folder(fingerprint)
    wanted = _settings(positions, settings.seed)
    shards, collected = [], 0
    for k, (prompt_id, text) in enumerate(prompts):
        if on_progress is not None:
            on_progress(k, len(prompts), prompt_id)
        path = kvzap_shards.shard_path(folder, prompt_id)
        shard = kvzap_shards.current(path, prompt_id, wanted)
        if shard is None:
            shard = collect(session, prompt_id, text, positions, settings.seed)
            kvzap_shards.write(path, shard)
            collected += 1
        shards.append(shard)
    if on_progress is not None:
        on_progress(len(prompts), len(prompts), "collected")
    layers = sorted(set.intersection(*(set(s.rows) for s in shards)))
    held = held_out_ids([p for p, _ in prompts])
    fit = [s for s in shards if s.prompt_id not in held]
    test = [s for s in shards if s.prompt_id in held]
    x, y = _stack(fit, layers)
    hx, hy = _stack(test, layers) if test else (None, None)
    outcome = train(x, y, settings, hx, hy, on_epoch)
    jaccard = {
        str(r): jaccard_against_kvzip(settings.model_type, outcome.weights, test, layers, r)
        for r in JACCARD_RATIOS
    }
    header = {
        "n_prompts": len(prompts),
        "prompts": [p for p, _ in prompts if p not in held],
        "held_out": sorted(held),
        "rows": int(x.shape[1]),
        "positions": positions,
        "target": wanted["target"],
        "input_dim": int(x.shape[-1]),
        "output_dim": int(y.shape[-1]),
        "hidden_dim": settings.hidden_dim if settings.model_type == "mlp" else None,
        "epochs": settings.epochs,
        "best_epoch": outcome.best_epoch,
        "learning_rate": settings.learning_rate,
        "batch_rows": settings.batch_rows,
        "seed": settings.seed,
        "train_mse": outcome.train_loss,
        "held_out_mse": outcome.held_out_loss,
        "held_out_r2": outcome.held_out_r2,
        "layer_r2": outcome.layer_r2,
        "jaccard_vs_kvzip": jaccard if test else None,
        "shard_version": KVZAP_VERSION,
    }
    weights = dict(zip(layers, outcome.weights, strict=True))
    surrogate = kvzap_surrogate.Surrogate(settings.model_type, fingerprint, weights, header)
    path = out or kvzap_surrogate.surrogate_path(settings.model_type, fingerprint)
    kvzap_surrogate.write(path, surrogate)
    return KVzapOutcome(path, kvzap_surrogate.read(path), collected, len(prompts) - collected, outcome)
