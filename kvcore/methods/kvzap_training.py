"""Training kvzap's surrogate with MLX: every layer's model at once, deterministic for a seed.

The rows are (attention input, log kvzip+ score per kv-head) pairs, one set per layer [L, N, hidden] → [L, N, H_kv].
The layers' models are independent, so their weights are stacked ([L, out, in]) and one batched matmul trains them
together; the loss is the mean squared error over layers, rows and heads (each layer's gradient is its own MSE's,
scaled by 1/L). As kvpress's training script: AdamW (weight decay 0.01), learning rate 5e-3 on a cosine over the
epochs, gradient norm clipped at 1, shuffled minibatches of 512 rows, 15 epochs, weights initialised as torch's
`nn.Linear` (uniform ±1/√fan_in) but for the output bias, which starts at the mean target. The weights of the epoch
with the lowest held-out loss are kept (the last epoch's when nothing is held out). The linear type is fitted as
kvpress fits it, in closed form: ridge regression per layer (penalty `KVZAP_RIDGE_ALPHA` on the weights, not on the
intercept, rows and targets centred), in float64 — no epochs, no seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from kvcore.defaults import (
    KVZAP_BATCH_ROWS,
    KVZAP_EPOCHS,
    KVZAP_GRAD_CLIP,
    KVZAP_HIDDEN_DIM,
    KVZAP_LEARNING_RATE,
    KVZAP_RIDGE_ALPHA,
    KVZAP_SEED,
    KVZAP_WEIGHT_DECAY,
)


@dataclass(frozen=True)
class TrainingSettings:
    model_type: str = "mlp"
    hidden_dim: int = KVZAP_HIDDEN_DIM
    epochs: int = KVZAP_EPOCHS
    learning_rate: float = KVZAP_LEARNING_RATE
    batch_rows: int = KVZAP_BATCH_ROWS
    seed: int = KVZAP_SEED

    def check(self) -> None:
        """ValueError in one line naming the setting to fix."""
        if self.model_type not in ("mlp", "linear"):
            raise ValueError(f"--kvzap-type takes mlp or linear, got {self.model_type!r}")
        for name in ("hidden_dim", "epochs", "batch_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"kvzap {name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"kvzap learning rate must be > 0, got {self.learning_rate!r}")


@dataclass
class TrainingOutcome:
    weights: list[dict[str, np.ndarray]]  # per stacked layer, [out, in] float32
    train_loss: float  # mean squared error over the kept epoch's minibatches
    held_out_loss: float | None
    held_out_r2: float | None  # mean over layers of 1 − SSE/SST (SST about each head's held-out mean)
    layer_r2: list[float] = field(default_factory=list)
    best_epoch: int = 0
    history: list[tuple[int, float, float | None]] = field(default_factory=list)


class StackedSurrogate(nn.Module):
    """L independent surrogates as stacked weights: mlp (w1 [L, hidden_dim, d], b1, w2 [L, H, hidden_dim], b2)
    or linear (w [L, H, d], b)."""

    def __init__(
        self, n_layers: int, d_in: int, d_out: int, model_type: str, hidden_dim: int, seed: int
    ) -> None:
        super().__init__()
        self.model_type = model_type
        keys = mx.random.split(mx.random.key(seed), 4)
        shapes = (
            {"w1": (hidden_dim, d_in), "b1": (hidden_dim,), "w2": (d_out, hidden_dim), "b2": (d_out,)}
            if model_type == "mlp"
            else {"w": (d_out, d_in), "b": (d_out,)}
        )
        fan_in = {"w1": d_in, "b1": d_in, "w2": hidden_dim, "b2": hidden_dim, "w": d_in, "b": d_in}
        for key, (name, shape) in zip(keys, shapes.items(), strict=False):
            bound = 1 / math.sqrt(fan_in[name])
            setattr(self, name, mx.random.uniform(-bound, bound, (n_layers, *shape), key=key))

    def __call__(self, x: mx.array) -> mx.array:
        """[L, N, d] -> [L, N, H]."""
        if self.model_type == "linear":
            return x @ self.w.transpose(0, 2, 1) + self.b[:, None]
        hidden = nn.gelu(x @ self.w1.transpose(0, 2, 1) + self.b1[:, None])
        return hidden @ self.w2.transpose(0, 2, 1) + self.b2[:, None]

    def per_layer(self) -> list[dict[str, np.ndarray]]:
        names = ("w1", "b1", "w2", "b2") if self.model_type == "mlp" else ("w", "b")
        arrays = {n: np.array(getattr(self, n), np.float32) for n in names}
        return [{n: a[i] for n, a in arrays.items()} for i in range(next(iter(arrays.values())).shape[0])]


def _mse(model: StackedSurrogate, x: mx.array, y: mx.array) -> mx.array:
    return ((model(x) - y) ** 2).mean()


def predict(model_type: str, weights: list[dict[str, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """[L, N, H] float32: the stacked layers' surrogates on rows x [L, N, d]."""
    model = StackedSurrogate(len(weights), x.shape[-1], 1, model_type, 1, 0)
    for name in weights[0]:
        setattr(model, name, mx.array(np.stack([w[name] for w in weights])))
    return np.array(model(mx.array(x, mx.float32)))


def r2_per_layer(y: np.ndarray, pred: np.ndarray) -> list[float]:
    """1 − SSE/SST per layer of [L, N, H] (float64), SST about each head's mean."""
    y, pred = y.astype(np.float64), pred.astype(np.float64)
    sse = ((y - pred) ** 2).sum(axis=(1, 2))
    sst = ((y - y.mean(axis=1, keepdims=True)) ** 2).sum(axis=(1, 2))
    return [float(1 - a / b) if b > 0 else float("nan") for a, b in zip(sse, sst, strict=True)]


def ridge(x: np.ndarray, y: np.ndarray, alpha: float = KVZAP_RIDGE_ALPHA) -> list[dict[str, np.ndarray]]:
    """Per layer of x [L, N, d] → y [L, N, H], the ridge solution (scikit-learn's `Ridge(alpha)` with an intercept):
    w = (XcᵀXc + αI)⁻¹ Xcᵀ Yc on the centred rows, b = ȳ − x̄ w; float32 {"w": [H, d], "b": [H]} per layer."""
    weights = []
    for xl, yl in zip(x.astype(np.float64), y.astype(np.float64), strict=True):
        x_mean, y_mean = xl.mean(axis=0), yl.mean(axis=0)
        xc, yc = xl - x_mean, yl - y_mean
        w = np.linalg.solve(xc.T @ xc + alpha * np.eye(xl.shape[1]), xc.T @ yc)  # [d, H]
        weights.append({"w": w.T.astype(np.float32), "b": (y_mean - x_mean @ w).astype(np.float32)})
    return weights


def train(
    x: np.ndarray,
    y: np.ndarray,
    settings: TrainingSettings,
    held_x: np.ndarray | None = None,
    held_y: np.ndarray | None = None,
    on_epoch: Callable[[int, int, float, float | None, float | None], None] | None = None,
) -> TrainingOutcome:
    """Fit the stacked surrogates on rows x [L, N, d] → y [L, N, H] (module docstring); `on_epoch(epoch, epochs,
    train MSE, held-out MSE, held-out R²)` after each epoch."""
    settings.check()
    n_layers, n_rows, d_in = x.shape
    if n_rows == 0:
        raise ValueError("kvzap has no training rows: give calibration prompts with text in them")
    if settings.model_type == "linear":
        weights = ridge(x, y)
        train_loss = float(((predict("linear", weights, x).astype(np.float64) - y) ** 2).mean())
        outcome = _outcome(weights, train_loss, held_x, held_y, "linear", 1, [])
        outcome.history = [(1, train_loss, outcome.held_out_loss)]
        if on_epoch is not None:
            on_epoch(1, 1, train_loss, outcome.held_out_loss, outcome.held_out_r2)
        return outcome
    mx.random.seed(settings.seed)
    model = StackedSurrogate(
        n_layers, d_in, y.shape[-1], settings.model_type, settings.hidden_dim, settings.seed
    )
    # the output bias starts at each (layer, head)'s mean target: log-scores sit far from 0, and so the first
    # epochs fit their spread instead of their offset
    bias = "b2" if settings.model_type == "mlp" else "b"
    setattr(model, bias, getattr(model, bias) + mx.array(y.mean(axis=1), mx.float32))
    steps_per_epoch = -(-n_rows // settings.batch_rows)
    epochs = settings.epochs

    def schedule(step: mx.array) -> mx.array:  # torch's CosineAnnealingLR(T_max=epochs), stepped per epoch
        epoch = (step // steps_per_epoch).astype(mx.float32)
        return settings.learning_rate * 0.5 * (1 + mx.cos(math.pi * epoch / epochs))

    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=KVZAP_WEIGHT_DECAY)
    loss_and_grad = nn.value_and_grad(model, _mse)
    xs, ys = mx.array(x, mx.float32), mx.array(y, mx.float32)
    hx = None if held_x is None or not held_x.shape[1] else mx.array(held_x, mx.float32)
    hy = None if hx is None or held_y is None else mx.array(held_y, mx.float32)
    rng = np.random.default_rng(settings.seed)
    best: tuple[float, int, list[dict[str, np.ndarray]], float] | None = None
    history = []
    for epoch in range(1, epochs + 1):
        order = rng.permutation(n_rows)
        total = 0.0
        for start in range(0, n_rows, settings.batch_rows):
            rows = mx.array(order[start : start + settings.batch_rows])
            loss, grads = loss_and_grad(model, xs[:, rows], ys[:, rows])
            grads, _ = optim.clip_grad_norm(grads, KVZAP_GRAD_CLIP)
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state, loss)
            total += float(loss) * rows.size
        train_loss = total / n_rows  # the epoch's minibatch losses (skorch's train_loss), not a second pass
        held_loss = r2 = None
        if hx is not None and hy is not None:
            pred = model(hx)
            held_loss = float(((pred - hy) ** 2).mean())
            r2 = float(np.nanmean(r2_per_layer(np.array(hy), np.array(pred))))
        history.append((epoch, train_loss, held_loss))
        if on_epoch is not None:
            on_epoch(epoch, epochs, train_loss, held_loss, r2)
        score = held_loss if held_loss is not None else -epoch  # nothing held out: the last epoch
        if best is None or score < best[0]:
            best = (score, epoch, model.per_layer(), train_loss)
    assert best is not None
    _, best_epoch, weights, train_loss = best
    return _outcome(weights, train_loss, held_x, held_y, settings.model_type, best_epoch, history)


def _outcome(
    weights: list[dict[str, np.ndarray]],
    train_loss: float,
    held_x: np.ndarray | None,
    held_y: np.ndarray | None,
    model_type: str,
    best_epoch: int,
    history: list[tuple[int, float, float | None]],
) -> TrainingOutcome:
    """The kept weights with their held-out MSE and R² (none when nothing is held out)."""
    held_loss = r2 = None
    layer_r2: list[float] = []
    if held_x is not None and held_y is not None and held_x.shape[1]:
        pred = predict(model_type, weights, held_x)
        held_loss = float(((pred.astype(np.float64) - held_y) ** 2).mean())
        layer_r2 = r2_per_layer(held_y, pred)
        r2 = float(np.nanmean(layer_r2))
    return TrainingOutcome(weights, train_loss, held_loss, r2, layer_r2, best_epoch, history)
