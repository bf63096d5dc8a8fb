"""kvzap on a tiny real model, the user data folder in a temp folder: collection shards and resume, training
(loss falls, deterministic), scores against a NumPy float64 forward of the saved weights, the refusal without a
surrogate, and the CLI from `kvlens calibrate kvzap` to `kvlens compress --method kvzap --positions`."""

from __future__ import annotations

import json
import math

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from kvcore.cli.main import main as cli_main
from kvcore.defaults import DATA_DIR_ENV
from kvcore.engine.kvzap_calibration import calibrate_kvzap
from kvcore.engine.session import CompressionConfig, Session
from kvcore.methods import kvzap_shards
from kvcore.methods.kvzap_training import TrainingSettings, train
from kvcore.model.fingerprint import model_fingerprint
from tests.attention_inputs import input_norm_outputs

PROMPTS = [
    ("a", "def main(argv):\n    return sum(x * x for x in argv)\n"),
    ("b", "class Cache:\n    def update(self, keys, values):\n        self.keys = keys\n"),
    ("c", "for i in range(10):\n    print(i, i * i)\n"),
]
#: A small run: few positions, a narrow MLP, two epochs.
SMALL = TrainingSettings(hidden_dim=16, epochs=2, batch_rows=16)
POSITIONS = 16
PROMPT = "def area(w, h):\n    return w * h\nprint(area(3, 4))\n"


@pytest.fixture(scope="module")
def session(model_dirs):
    return Session.load(str(model_dirs["llama"]))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """One temp data folder for the module, holding the surrogate the first test trains."""
    folder = tmp_path_factory.mktemp("kvzap") / "data"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(DATA_DIR_ENV, str(folder))
        yield folder


@pytest.fixture(scope="module")
def calibrated(session, data_dir):
    """Two prompts collected, then the third with the first two resumed; the surrogate of that run."""
    first = calibrate_kvzap(session, PROMPTS[:2], SMALL, POSITIONS)
    again = calibrate_kvzap(session, PROMPTS, SMALL, POSITIONS)
    return first, again


def test_collection_writes_a_shard_per_prompt_and_resume_skips_them(session, calibrated, data_dir):
    first, again = calibrated
    assert (first.collected, first.skipped) == (2, 0)
    assert (again.collected, again.skipped) == (1, 2)
    folder = kvzap_shards.shard_folder(model_fingerprint(session.info.path))
    shards = [kvzap_shards.read(p) for p in sorted(folder.glob("*.safetensors"))]
    assert sorted(s.prompt_id for s in shards) == ["a", "b", "c"]
    n_layers, hidden, n_kv = 4, 128, 2
    for shard in shards:
        n = min(POSITIONS, shard.n_tokens)
        assert shard.positions.shape == (n,) and sorted(shard.rows) == list(range(n_layers))
        assert shard.rows[0].shape == (n, hidden) and shard.targets[0].shape == (n, n_kv)
        assert all(np.isfinite(t).all() and (t <= 0).all() for t in shard.targets.values())  # log of ≤ 1
    # the targets are log kvzip+ (kvzip with kvzip_plus_normalization) at the sampled positions
    session.prefill(PROMPTS[0][1], n_tokens=1, chat_template=False)
    kvzip = session.ranking(CompressionConfig("kvzip", 0.5, params={"kvzip_plus_normalization": 1}))
    shard = next(s for s in shards if s.prompt_id == "a")
    for layer in range(n_layers):
        want = np.log(np.maximum(kvzip.layers[layer].scores[:, shard.positions], 1e-12)).T
        np.testing.assert_allclose(shard.targets[layer], want, rtol=1e-4, atol=1e-4)
    header = again.surrogate.header
    resumed = calibrate_kvzap(session, PROMPTS, SMALL, POSITIONS)  # every shard read back: the same surrogate
    assert resumed.collected == 0 and resumed.surrogate.digest == again.surrogate.digest
    assert header["n_prompts"] == 3 and len(header["held_out"]) == 1
    assert header["held_out_r2"] is not None and set(header["jaccard_vs_kvzip"]) == {"0.25", "0.5"}
    assert again.path == data_dir / f"kvzap-mlp-{model_fingerprint(session.info.path)[:16]}.safetensors"


def test_training_lowers_the_loss_and_is_deterministic_for_a_seed(session, calibrated):
    folder = kvzap_shards.shard_folder(model_fingerprint(session.info.path))
    shards = [kvzap_shards.read(p) for p in sorted(folder.glob("*.safetensors"))]
    x = np.stack([np.concatenate([s.rows[i] for s in shards]) for i in range(4)])
    y = np.stack([np.concatenate([s.targets[i] for s in shards]) for i in range(4)])
    settings = TrainingSettings(hidden_dim=16, epochs=6, batch_rows=16, seed=3)
    one, two = train(x, y, settings), train(x, y, settings)
    losses = [loss for _, loss, _ in one.history]
    assert losses[-1] < losses[0]
    for a, b in zip(one.weights, two.weights, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    other = train(x, y, TrainingSettings(hidden_dim=16, epochs=6, batch_rows=16, seed=4))
    assert not np.array_equal(other.weights[0]["w1"], one.weights[0]["w1"])


def _attention_inputs(model, ids) -> list[np.ndarray]:
    with input_norm_outputs(model) as rows:
        model(mx.array([ids]), cache=make_prompt_cache(model))
    return [np.array(r[0].astype(mx.float32), np.float64) for r in rows]


def _numpy_surrogate(path, layer, x):
    arrays = {k: np.array(v, np.float64) for k, v in mx.load(str(path)).items()}
    w = {n: arrays[f"layer{layer}.{n}"] for n in ("w1", "b1", "w2", "b2")}
    h = x @ w["w1"].T + w["b1"]
    erf = np.vectorize(math.erf)
    h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
    return (h @ w["w2"].T + w["b2"]).T  # [H_kv, T]


def test_scores_equal_a_numpy_forward_of_the_saved_weights(session, calibrated):
    path = calibrated[1].path
    session.prefill(PROMPT, n_tokens=1, chat_template=False)
    state = session.compress(CompressionConfig("kvzap", 0.5, schedule="paper"))
    ranking = session.ranking(state.config)
    inputs = _attention_inputs(session.model, session.prompt_ids)
    n = int(0.5 * len(session.prompt_ids))  # kvpress's budget: int(T·r)
    for layer, x in enumerate(inputs):
        want = _numpy_surrogate(path, layer, x)
        np.testing.assert_allclose(ranking.layers[layer].scores, want, rtol=1e-4, atol=1e-4)
        for head in range(want.shape[0]):  # top n per kv-head, no sinks (kvpress's ScorerPress)
            kept = np.flatnonzero(state.kept[layer, head])
            assert kept.size == n
            assert set(kept.tolist()) == set(np.argsort(-want[head], kind="stable")[:n].tolist())
    # kvpress's pairing: a threshold on the log-score, the recent window protected
    threshold = float(np.median(ranking.layers[0].scores))
    dms = session.compress(
        CompressionConfig("dms-kvzap", 0.5, params={"threshold": threshold, "sliding_window_size": 4})
    )
    scores = _numpy_surrogate(path, 0, inputs[0])
    older = scores[:, : len(session.prompt_ids) - 4] >= threshold
    np.testing.assert_array_equal(dms.kept[0, :, : older.shape[1]], older)


def test_a_missing_surrogate_is_refused_with_the_command(session, tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "empty"))
    pattern = r"run `kvlens calibrate kvzap --model \S+ --prompts DIR`"
    for name in ("kvzap", "dms-kvzap"):
        with pytest.raises(ValueError, match=pattern) as err:
            session.check_config(
                CompressionConfig(name, 0.5, params={"threshold": -5.0} if "dms" in name else {})
            )
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="--prompts DIR --kvzap-type linear`"):
        session.check_config(CompressionConfig("kvzap", 0.5, params={"model_type": 1}))


def test_cli_calibrates_then_compresses_with_kvzap(model_dirs, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for name, text in PROMPTS[:2]:
        (prompts / f"{name}.txt").write_text(text)
    model = str(model_dirs["llama"])
    small = ["--kvzap-type", "linear", "--kvzap-epochs", "2", "--kvzap-positions", "16"]
    assert cli_main(["calibrate", "qfilter", "--model", model, "--prompts", str(prompts), *small]) == 2
    assert "the --kvzap-* options set kvzap's training, not qfilter's" in capsys.readouterr().err
    assert cli_main(["calibrate", "kvzap", "--model", model, "--prompts", str(prompts), *small]) == 2
    assert "the linear surrogate is a closed-form ridge fit" in capsys.readouterr().err
    small = ["--kvzap-type", "linear", "--kvzap-positions", "16"]
    assert cli_main(["calibrate", "kvzap", "--model", model, "--prompts", str(prompts), *small]) == 0
    assert "kvzap linear surrogate, 2 prompts (2 prompts collected)" in capsys.readouterr().out
    prompt, out = tmp_path / "prompt.txt", tmp_path / "kept.json"
    prompt.write_text(PROMPT)
    argv = ["compress", "--model", model, "--prompt-file", str(prompt), "--tokens", "1", "--no-chat-template"]
    argv += ["--method", "kvzap", "--param", "model_type=1", "--ratio", "0.5", "--positions", str(out)]
    assert cli_main(argv) == 0
    assert json.loads(out.read_text())


def test_the_linear_surrogate_is_kvpress_ridge_fit_in_closed_form():
    """kvpress fits the linear type with scikit-learn's Ridge() (alpha 1, intercept unpenalised): its normal
    equations hold for the weights, the intercept makes the mean residual zero, and training needs no epochs."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 200, 8))
    y = x @ rng.normal(size=(2, 8, 3)) + rng.normal(size=(2, 1, 3)) + 0.1 * rng.normal(size=(2, 200, 3))
    outcome = train(x, y, TrainingSettings(model_type="linear", epochs=1))
    for layer, w in enumerate(outcome.weights):
        residual = y[layer] - (x[layer] @ w["w"].T.astype(np.float64) + w["b"])
        np.testing.assert_allclose(residual.mean(axis=0), 0, atol=1e-5)
        xc = x[layer] - x[layer].mean(axis=0)
        # d/dW of ‖Y − XW − b‖² + α‖W‖² vanishes: Xcᵀ residual = α W
        np.testing.assert_allclose(xc.T @ residual, 1.0 * w["w"].T, atol=1e-3)
    assert outcome.history == [(1, outcome.train_loss, None)] and outcome.train_loss < 0.02
