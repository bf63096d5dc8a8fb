"""`kvlens calibrate` on a tiny real model, with the user data folder in a temp folder (KVLENS_DATA_DIR):
the artifact, resume, qfilter and expected_attention_stats against NumPy, and the refusals (missing, corrupt)."""

from __future__ import annotations

import numpy as np
import pytest

from kvcore.capture import prefill as capture
from kvcore.cli.main import main as cli_main
from kvcore.defaults import DATA_DIR_ENV
from kvcore.engine.calibration_run import calibrate
from kvcore.engine.session import CompressionConfig, Session
from kvcore.methods import calibration, get, selection
from kvcore.model import prompting
from kvcore.model.fingerprint import model_fingerprint
from tests.kvcore.methods import real_layers
from tests.model_factory import ARCHS

PROMPTS = [
    ("a", "def main(argv):\n    return sum(x * x for x in argv)\n"),
    ("b", "class Cache:\n    def update(self, keys, values):\n        self.keys = keys\n"),
    ("c", "for i in range(10):\n    print(i, i * i)\n"),
]


@pytest.fixture(scope="module")
def session(model_dirs):
    return Session.load(str(model_dirs["llama"]))


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    return tmp_path / "data"


def _ids(session, text):
    return prompting.encode_prompt(session.tokenizer, text, False, None)[0]


def test_calibrate_writes_the_artifact_and_resumes_to_the_same_one(session, data_dir, tmp_path):
    outcome = calibrate(session, "qfilter", PROMPTS[:2])
    fingerprint = model_fingerprint(session.info.path)
    assert outcome.path == data_dir / f"qfilter-{fingerprint[:16]}.safetensors" and outcome.path.is_file()
    assert (outcome.folded, outcome.skipped) == (2, 0)
    resumed = calibrate(session, "qfilter", PROMPTS)
    assert (resumed.folded, resumed.skipped) == (1, 2)
    one_run = calibrate(session, "qfilter", PROMPTS, out=tmp_path / "one.safetensors")
    a = calibration.read(resumed.path, "qfilter", fingerprint)
    b = calibration.read(one_run.path, "qfilter", fingerprint)
    assert (a.method, a.fingerprint, a.n_prompts, a.done) == ("qfilter", fingerprint, 3, ("a", "b", "c"))
    assert a.counts == b.counts == (sum(len(_ids(session, t)) for _, t in PROMPTS),) * 4
    for x, y in zip(a.means + a.m2s, b.means + b.m2s, strict=True):
        np.testing.assert_array_equal(x, y)


def test_qfilter_and_expected_attention_stats_match_numpy(session, data_dir):
    config = dict(ARCHS["llama"])
    calibration_layers = [real_layers.layers(session.model, config, _ids(session, t)) for _, t in PROMPTS]
    ids = real_layers.prompt_ids(session.model, n=40)
    result = capture.prefill_with_capture(session.model, ids)
    layers = real_layers.layers(session.model, config, ids)

    artifact = calibrate(session, "qfilter", PROMPTS).artifact
    method = get("qfilter").with_artifact(artifact)
    cached = selection.rank(result.observations, method)  # kvpress's: the cached keys, after RoPE
    pre = selection.rank(result.observations, method.with_values(post_rope_keys=0))
    for i, layer in enumerate(layers):
        queries = np.concatenate([c[i].queries_pre for c in calibration_layers], axis=1)  # [H_q, N, D]
        filters = []
        for h in range(layer.keys.shape[0]):
            stacked = queries[2 * h : 2 * h + 2].reshape(-1, queries.shape[-1])  # the group's queries
            direction = np.linalg.svd(stacked, full_matrices=False)[2][0]
            filters.append(direction * np.sign(stacked.mean(axis=0) @ direction))
        filters = np.array(filters)[:, None, :]
        np.testing.assert_allclose(
            cached.layers[i].scores, -(layer.keys * filters).sum(-1), rtol=1e-3, atol=1e-3
        )
        np.testing.assert_allclose(
            pre.layers[i].scores, -(layer.keys_pre * filters).sum(-1), rtol=1e-3, atol=1e-3
        )

    stats = calibrate(session, "expected_attention_stats", PROMPTS).artifact
    for i in range(len(layers)):
        queries = np.concatenate([c[i].queries_pre[:, 4:] for c in calibration_layers], axis=1)
        np.testing.assert_allclose(stats.mean(i), queries.mean(axis=1), rtol=1e-4, atol=1e-5)
        centred = queries - queries.mean(axis=1, keepdims=True)
        cov = np.einsum("htd,hte->hde", centred, centred) / (queries.shape[1] - 1)
        np.testing.assert_allclose(stats.covariance(i), cov, rtol=1e-3, atol=1e-4)
    scored = selection.rank(result.observations, get("expected_attention_stats").with_artifact(stats))
    assert all(np.isfinite(r.scores).all() for r in scored.layers)


def test_missing_artifact_is_refused_with_the_command(session, data_dir, capsys):
    with pytest.raises(ValueError, match=r"run `kvlens calibrate qfilter --model \S+ --prompts DIR`") as err:
        session.check_config(CompressionConfig("adakv-qfilter", 0.5))
    assert "\n" not in str(err.value)
    code = cli_main(
        [
            "compress",
            "--model",
            session.info.path,
            "--method",
            "expected_attention_stats",
            "--prompt",
            "x y z",
        ]
    )
    assert code == 2
    assert "kvlens calibrate expected_attention_stats --model" in capsys.readouterr().err


def test_corrupt_artifact_is_refused_and_kept(session, data_dir):
    path = calibration.artifact_path("qfilter", model_fingerprint(session.info.path))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a readable KV Lens calibration file") as err:
        calibrate(session, "qfilter", PROMPTS[:1])
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    with pytest.raises(ValueError, match="delete"):
        session.check_config(CompressionConfig("qfilter", 0.5))
    assert path.read_bytes() == b"not a safetensors file"


def test_cli_calibrate_draws_progress(session, data_dir, tmp_path, capsys):
    folder = tmp_path / "prompts"
    folder.mkdir()
    for name, text in PROMPTS[:2]:
        (folder / f"{name}.txt").write_text(text)
    assert cli_main(["calibrate", "qfilter", "--model", session.info.path, "--prompts", str(folder)]) == 0
    out = capsys.readouterr()
    assert "2/2" in out.err and "2 prompts" in out.out
    assert cli_main(["calibrate", "snapkv", "--model", session.info.path, "--prompts", str(folder)]) == 2
    assert "needs no calibration" in capsys.readouterr().err


def test_duo_attention_calibrated_averages_the_head_scores_of_the_set(session, data_dir):
    from tests.kvcore.methods.test_duo_attention import inv_freqs, oracle_head_scores

    config = dict(ARCHS["llama"])
    first = calibrate(session, "duo_attention_calibrated", PROMPTS[:2])
    artifact = calibrate(session, "duo_attention_calibrated", PROMPTS).artifact
    assert first.artifact.sums[0] is not None and artifact.n_prompts == 3
    per_prompt = [
        np.stack(
            [
                oracle_head_scores(layer, inv_freqs(config), 500)
                for layer in real_layers.layers(session.model, config, _ids(session, t))
            ]
        )
        for _, t in PROMPTS
    ]
    want = np.mean(per_prompt, axis=0)  # [L, H_kv]
    got = np.stack(artifact.sums) / artifact.n_prompts
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    ids = real_layers.prompt_ids(session.model, n=40)
    result = capture.prefill_with_capture(session.model, ids)
    method = get("duo_attention_calibrated", sink_size=4, recent_size=8).with_artifact(artifact)
    kept = selection.select(selection.rank(result.observations, method), 0.5)
    streaming = np.argsort(want, axis=None)[: want.size // 2]
    counts = np.array([[len(h) for h in layer] for layer in kept]).ravel()
    assert set(np.flatnonzero(counts == 12)) == set(streaming) and (np.delete(counts, streaming) == 40).all()
