"""Long generations (issue 40): the teacher-forced reference pass runs in chunks and equals one shot; the dense
reference is computed once per prefill and reused by every setting; a generation past the model's trained context
runs only when asked for (--beyond-context), and the outputs say so."""

from __future__ import annotations

import csv
import json
import math
import shutil

import numpy as np
import pytest

from kvcore.cli.main import main
from kvcore.defaults import SCHEDULES
from kvcore.engine.session import CompressionConfig, Session
from kvcore.engine.sweep import decode_grid, run_decode_sweep, run_sweep

PROMPT = "def main(argv):\n    return sum(x * x for x in argv)\n" * 2
N = 10


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=N, chat_template=False)
    return s


@pytest.fixture(scope="module")
def small(model_dirs, tmp_path_factory):
    """The tiny llama with a trained context of the prompt + 4 positions; (folder, prompt file)."""
    folder = shutil.copytree(model_dirs["llama"], tmp_path_factory.mktemp("ctx") / "small")
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = len(Session.load(str(folder)).tokenizer.encode(PROMPT)) + 4
    (folder / "config.json").write_text(json.dumps(config))
    prompt = folder.parent / "prompt.txt"
    prompt.write_text(PROMPT)
    return folder, prompt


@pytest.mark.parametrize(
    "config",
    [
        CompressionConfig("full", 1.0),
        CompressionConfig("snapkv", 0.5, bits=4, group_size=32),
        CompressionConfig("streaming_llm", 0.5, schedule="mlx-lm"),
    ],
    ids=["dense-paper", "snapkv-4bit", "streaming-mlx-lm"],
)
def test_reference_pass_in_chunks_equals_one_shot(session, config):
    state = session.compress(config)
    tokens = session.dense_tokens
    one_shot = session._reference_logits(state.cache, config.schedule, tokens, chunk=1 << 30)
    calls = session.forward_calls
    chunked = session._reference_logits(state.cache, config.schedule, tokens, chunk=3)
    fed = len(tokens) - (1 if config.schedule == "paper" else 0)
    assert session.forward_calls - calls == math.ceil(
        fed / 3
    )  # one forward pass a chunk, into one cache copy
    assert chunked.shape == one_shot.shape == (N, session.info.vocab_size)
    np.testing.assert_allclose(chunked, one_shot, atol=2e-5, rtol=1e-4)
    if config.method == "full":  # the dense reference is this pass
        np.testing.assert_allclose(session.dense_reference(config.schedule), one_shot, atol=2e-5, rtol=1e-4)


def test_the_dense_reference_is_computed_once_and_reused_by_every_setting(session, model_dirs):
    fresh = Session.load(str(model_dirs["llama"]))
    fresh.prefill(PROMPT, n_tokens=4, chat_template=False)
    assert fresh.reference_passes == 0  # a schedule's pass waits until something is measured under it
    for _ in range(2):
        fresh.regenerate(fresh.compress(CompressionConfig("snapkv", 0.5)))
    assert fresh.reference_passes == 1  # "paper": once
    fresh.extend(2)
    fresh.regenerate(fresh.compress(CompressionConfig("snapkv", 0.5, schedule="mlx-lm")))
    assert fresh.reference_passes == 2 and len(fresh.dense_reference("mlx-lm")) == 6
    refs = {s: session.dense_reference(s) for s in SCHEDULES}
    passes, dense = session.reference_passes, session.dense_tokens
    configs = [CompressionConfig("snapkv", 0.5), CompressionConfig("knorm", 0.25, schedule="mlx-lm")]
    assert len(list(run_sweep(session, configs))) == 2
    policies = decode_grid(["streaming_llm", "snapkv"], [8, 12], interval=4, n_sink=2)
    assert len(list(run_decode_sweep(session, configs, policies, N))) == 8
    assert session.reference_passes == passes and session.dense_tokens is dense
    assert all(session._dense_logits[s] is refs[s] for s in SCHEDULES)


def test_past_the_trained_context_only_when_asked_for(small):
    folder, _ = small
    s = Session.load(str(folder))
    with pytest.raises(ValueError, match="--beyond-context") as refused:
        s.prefill(PROMPT, n_tokens=8, chat_template=False)
    assert "generate at most 4 tokens" in str(refused.value) and "\n" not in str(refused.value)
    assert s.prompt_ids == []  # nothing was prefilled
    s.prefill(PROMPT, n_tokens=4, chat_template=False)
    assert not s.beyond_context
    info = s.prefill(PROMPT, n_tokens=8, chat_template=False, beyond_context=True)
    assert info["beyond_context"] and s.beyond_context and len(s.dense_tokens) == 8
    assert s.positions_used == s.info.max_context + 4


def test_cli_refuses_then_records_beyond_context(small, tmp_path, capsys):
    folder, prompt = small
    argv = ["compress", "--model", str(folder), "--prompt-file", str(prompt), "--no-chat-template"]
    argv += ["--method", "full", "--ratio", "1.0", "--tokens", "10", "--json"]
    timeline = tmp_path / "t.csv"
    decode = [
        "--decode-method",
        "streaming_llm",
        "--decode-budget",
        "6",
        "--decode-interval",
        "2",
        "--n-sink",
        "2",
    ]
    assert main([*argv, *decode, "--timeline", str(timeline)]) == 2
    err = capsys.readouterr().err
    assert "--beyond-context" in err and err.count("\n") == 1 and not timeline.exists()
    assert main([*argv, *decode, "--timeline", str(timeline), "--beyond-context"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (
        row["beyond_context"] is True and row["trained_context"] == Session.load(str(folder)).info.max_context
    )
    assert row["decode_tokens"] == 10 and row["max_cache_tokens"] <= 6 + 2
    with timeline.open() as f:
        assert next(csv.reader(f)) == ["step", "layer", "kv_head", "position", "kept"]


def test_cli_decode_sweep_csv_records_beyond_context(small, tmp_path, capsys):
    folder, prompt = small
    out = tmp_path / "d.csv"
    argv = ["sweep", "--model", str(folder), "--prompt-file", str(prompt), "--tokens", "8"]
    argv += ["--methods", "full", "--ratios", "1.0", "--bits", "16", "--csv", str(out), "--beyond-context"]
    argv += ["--decode-methods", "streaming_llm", "--decode-budgets", "6", "--decode-interval", "2"]
    assert main([*argv, "--n-sink", "2"]) == 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and rows[0]["beyond_context"] == "1"  # write_csv writes booleans as 0/1


def test_cli_sweep_csv_records_beyond_context(small, tmp_path, capsys):
    folder, prompt = small
    out = tmp_path / "s.csv"
    argv = ["sweep", "--model", str(folder), "--prompt-file", str(prompt), "--tokens", "6"]
    argv += ["--methods", "snapkv", "--ratios", "0.5", "--bits", "16", "--csv", str(out)]
    assert main([*argv, "--beyond-context"]) == 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["beyond_context"] == "1" for r in rows)
    assert main([*argv, "--tokens", "2"]) == 0  # inside the context: the usual columns
    with out.open() as f:
        assert "beyond_context" not in next(csv.reader(f))


def test_prompt_sets_refuse_beyond_context_before_the_model_loads(tmp_path, capsys):
    prompts = tmp_path / "set.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPT}) + "\n")
    argv = ["sweep", "--model", str(tmp_path / "no-model"), "--prompts", str(prompts), "--beyond-context"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--beyond-context applies to one prompt" in err and err.count("\n") == 1


def test_beyond_context_where_it_changes_nothing_is_refused_before_the_model_loads(
    session, tmp_path, capsys, monkeypatch
):
    """With --session (the saved continuation is the reference) or --questions (answers must fit the trained
    context) the flag could change nothing: one line naming the fix, not silence."""
    from kvcore.engine.session_file import save_session

    saved = tmp_path / "s.kvlens"
    save_session(saved, session)
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "What does main return?"}\n')
    monkeypatch.setattr(Session, "load", lambda *a, **k: pytest.fail("a model load ran"))
    assert main(["compress", "--session", str(saved), "--beyond-context", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--session file keeps its saved continuation" in err
    assert "drop --beyond-context" in err
    argv = ["compress", "--prompt", PROMPT, "--questions", str(questions), "--beyond-context"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--beyond-context does not apply to --questions" in err


def test_a_question_past_the_context_says_beyond_context_does_not_apply(small):
    folder, _ = small
    s = Session.load(str(folder))
    s.prefill(PROMPT, n_tokens=2, chat_template=False)
    with pytest.raises(ValueError, match="--beyond-context or the window's box, does not apply to questions"):
        s.answer_tokens(None, " and then", 4, "paper")


def _interrupt_at(k: int):
    def progress(done: int, total: int) -> None:
        if done == k:
            raise KeyboardInterrupt

    return progress


def test_ctrl_c_in_the_dense_continuation_keeps_what_was_generated(model_dirs, session):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(
        PROMPT, n_tokens=N, chat_template=False, on_continuation=_interrupt_at(4), keep_interrupted=True
    )
    assert s.dense_tokens == session.dense_tokens[:4]
    s.extend(N - 4)  # the decode cache the interrupted step left half-fed is rebuilt from the kept tokens
    assert s.dense_tokens == session.dense_tokens
    with pytest.raises(KeyboardInterrupt):  # not asked for: the prefill is left as it was
        s.prefill("x y z", n_tokens=N, chat_template=False, on_continuation=_interrupt_at(2))
    assert s.dense_tokens == session.dense_tokens


def test_cli_ctrl_c_in_the_dense_continuation_measures_the_tokens_kept(model_dirs, capsys, monkeypatch):
    import kvcore.cli.main as cli

    monkeypatch.setattr(cli, "_continuation_progress", lambda n, label: _interrupt_at(3) if n == N else None)
    argv = ["compress", "--model", str(model_dirs["llama"]), "--prompt", PROMPT, "--no-chat-template"]
    argv += ["--method", "snapkv", "--ratio", "0.5", "--tokens", str(N), "--json"]
    argv += [
        "--decode-method",
        "streaming_llm",
        "--decode-budget",
        "8",
        "--decode-interval",
        "2",
        "--n-sink",
        "2",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert f"stopped early, 3 of {N} tokens kept" in captured.err and captured.err.count("\n") == 1
    row = json.loads(captured.out)
    assert row["dense_interrupted"] is True and row["decode_tokens"] == 3 and not row["decode_interrupted"]


@pytest.mark.parametrize("decode", [False, True], ids=["sweep", "decode-sweep"])
def test_cli_sweep_csv_says_the_dense_continuation_stopped_early(
    model_dirs, capsys, monkeypatch, tmp_path, decode
):
    import kvcore.cli.main as cli

    monkeypatch.setattr(cli, "_continuation_progress", lambda n, label: _interrupt_at(3) if n == N else None)
    out = tmp_path / "sweep.csv"
    argv = ["sweep", "--model", str(model_dirs["llama"]), "--prompt", PROMPT, "--no-chat-template"]
    argv += ["--methods", "snapkv", "--ratios", "0.5", "--bits", "16", "--tokens", str(N), "--csv", str(out)]
    if decode:
        argv += ["--decode-methods", "streaming_llm", "--decode-budgets", "8", "--n-sink", "2"]
    assert main(argv) == 0
    capsys.readouterr()
    rows = list(csv.DictReader(out.open()))
    assert rows and all(r["dense_interrupted"] == "1" for r in rows)  # write_csv writes booleans as 0/1
