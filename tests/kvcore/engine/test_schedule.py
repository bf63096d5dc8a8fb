"""The two compression schedules: "paper" compresses the whole prompt, "mlx-lm" all but its last token.

One prefill serves both; switching is a recompress. Under "mlx-lm" every observation equals a plain prefill of
the prompt minus its last token (today's behaviour); under "paper" the windows end at the last prompt token.
"""

import csv
import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from kvcore.capture import prefill as capture
from kvcore.cli.main import main
from kvcore.engine.session import CompressionConfig, Session

PROMPT = (
    "def mean(values):\n    return sum(values) / len(values)\nclass Box:\n    size = 3\n"
    "The quick brown fox jumps over the lazy dog. " * 2
)
N_TOKENS = 8


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=N_TOKENS)
    return s


def test_mlx_lm_observations_equal_a_prefill_without_the_last_token(session):
    ids = session.prompt_ids
    plain = capture.prefill_with_capture(session.model, ids[:-1], window=256, h2o=True)
    held = session._observed("mlx-lm")
    assert held.n_tokens == len(ids) - 1
    for ours, ref in zip(held.observations, plain.observations, strict=True):
        assert ours.n_tokens == ref.n_tokens == len(ids) - 1
        assert np.array_equal(np.array(ours.keys), np.array(ref.keys))
        assert np.array_equal(np.array(ours.window_queries), np.array(ref.window_queries))
        assert np.array_equal(np.array(ours.ensure_h2o()), np.array(ref.h2o_sums))
    full = session._observed("paper")
    assert all(o.n_tokens == len(ids) for o in full.observations)
    last_query = np.array(full.observations[0].window_queries[:, -1])
    assert not np.allclose(last_query, np.array(held.observations[0].window_queries[:, -1]))


def test_dense_continuation_is_mlx_lms_greedy_generation(session):
    prompt = mx.array(session.prompt_ids)
    steps = generate_step(
        prompt, session.model, max_tokens=N_TOKENS, sampler=lambda lp: mx.argmax(lp, axis=-1)
    )
    assert session.dense_tokens == [int(t) for t, _ in steps]


def test_paper_covers_the_whole_prompt_and_takes_the_first_token_from_the_dense_prefill(session):
    T = len(session.prompt_ids)
    assert session.n_compressible("paper") == T and session.n_compressible("mlx-lm") == T - 1
    snap = session.compress(CompressionConfig("snapkv", 0.5, window=8))
    assert snap.kept.shape[2] == T
    assert snap.kept[:, :, T - 8 :].all()  # the window, ending at the last prompt token, is always kept
    streaming = session.compress(CompressionConfig("streaming_llm", 0.2))
    regen = session.regenerate(streaming)
    assert regen.tokens[0] == session.dense_tokens[0]
    assert regen.metrics["first_compressed_step"] == 1 and regen.metrics["compared_tokens"] == N_TOKENS - 1
    assert regen.metrics["kl_per_step"][0] == 0.0 and len(regen.metrics["kl_per_step"]) == N_TOKENS
    old = session.compress(CompressionConfig("streaming_llm", 0.2, schedule="mlx-lm"))
    assert old.kept.shape[2] == T - 1
    assert session.regenerate(old).metrics["compared_tokens"] == N_TOKENS


def test_paper_metrics_leave_out_the_dense_first_token(session):
    state = session.compress(CompressionConfig("random", 0.1))
    regen = session.regenerate(state)
    kl = np.array(regen.metrics["kl_per_step"])
    assert regen.metrics["kl_mean"] == pytest.approx(kl[1:].mean(), rel=1e-12)
    assert regen.metrics["kl_mean"] > 0


@pytest.mark.parametrize("schedule", ["paper", "mlx-lm"])
def test_full_is_lossless_under_both_schedules(session, schedule):
    regen = session.regenerate(session.compress(CompressionConfig("full", 1.0, schedule=schedule)))
    assert regen.tokens == session.dense_tokens
    assert regen.metrics["kl_max"] == 0.0 and regen.metrics["agreement"] == 1.0


def test_switching_schedules_never_prefills(session):
    before = session.forward_calls
    for schedule in ("paper", "mlx-lm", "paper"):
        for method in ("snapkv", "h2o", "tova", "adakv", "pyramidkv"):
            session.compress(CompressionConfig(method, 0.3, bits=4, group_size=32, schedule=schedule))
    assert session.forward_calls == before


def test_unknown_schedule_is_explained():
    with pytest.raises(ValueError, match="schedule must be one of paper, mlx-lm"):
        CompressionConfig(schedule="kvpress")


def test_cli_schedule_reaches_csv_and_positions(model_dirs, tmp_path, capsys):
    prompt = tmp_path / "p.txt"
    prompt.write_text(PROMPT)
    T = {}
    for schedule in ("paper", "mlx-lm"):
        csv_path, pos_path = tmp_path / f"{schedule}.csv", tmp_path / f"{schedule}.json"
        argv = [
            "compress",
            "--model",
            str(model_dirs["llama"]),
            "--prompt-file",
            str(prompt),
            "--tokens",
            "3",
        ]
        argv += ["--schedule", schedule, "--csv", str(csv_path), "--positions", str(pos_path), "--json"]
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out)["schedule"] == schedule
        kept = json.loads(pos_path.read_text())
        assert kept["schedule"] == schedule
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        T[schedule] = {r["tokens_total"] for r in rows}
        assert {r["schedule"] for r in rows} == {schedule}
        n_prompt = len(kept["prompt_tokens"])
        assert max(max(h) for layer in kept["layers"] for h in layer["heads"]) < n_prompt
    assert int(T["paper"].pop()) == int(T["mlx-lm"].pop()) + 1


def test_cli_help_explains_schedules(capsys):
    with pytest.raises(SystemExit):
        main(["compress", "--help"])
    out = capsys.readouterr().out
    assert "--schedule {paper,mlx-lm}" in out and "dense prefill" in out
