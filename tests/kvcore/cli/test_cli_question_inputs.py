"""`kvlens compress --questions`: a context is required, the model's context bounds context + question + answer,
and under a chat template context and question are one user message (context, then question)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvcore.cli.main import main
from kvcore.engine.session import Session
from kvcore.model.prompting import render_chat
from tests.model_factory import with_chat_template

CONTEXT = "def main(argv):\n    return sum(x * x for x in argv)\n" * 3
QUESTION = "What does main return?"


@pytest.fixture(scope="module")
def chat_dir(model_dirs, tmp_path_factory) -> Path:
    return with_chat_template(model_dirs["llama"], tmp_path_factory.mktemp("chat") / "llama-chat")


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    context, questions = tmp_path / "context.py", tmp_path / "questions.jsonl"
    context.write_text(CONTEXT)
    questions.write_text(json.dumps({"question": QUESTION, "answer": "sum"}) + "\n")
    return context, questions


def _run(model: Path, files, *extra: str) -> int:
    context, questions = files
    argv = ["compress", "--model", str(model), "--context-file", str(context), "--questions", str(questions)]
    return main([*argv, "--method", "snapkv", "--ratio", "0.5", "--tokens", "3", *extra])


def test_questions_without_a_context_are_one_line(files, tmp_path, capsys):
    argv = ["compress", "--model", str(tmp_path / "none"), "--questions", str(files[1])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--questions needs a context" in err and "--context-file" in err and err.count("\n") == 1


def test_a_question_beyond_the_models_context_is_one_line(model_dirs, files, tmp_path, capsys):
    small = shutil.copytree(model_dirs["llama"], tmp_path / "small")
    config = json.loads((small / "config.json").read_text())
    n_context = len(Session.load(str(small)).tokenizer.encode(CONTEXT))
    config["max_position_embeddings"] = n_context + 6  # room for the context's answer, not for the question
    (small / "config.json").write_text(json.dumps(config))
    out = tmp_path / "stats.csv"
    assert _run(small, files, "--no-chat-template", "--csv", str(out)) == 2
    err = capsys.readouterr().err
    assert "the model's context is" in err and "shorten the context" in err and err.count("\n") == 1
    assert not out.exists()  # nothing half-written


def test_chat_template_wraps_context_then_question_as_one_user_message(chat_dir, files, capsys):
    assert _run(chat_dir, files, "--json") == 0
    row = json.loads(capsys.readouterr().out)
    session = Session.load(str(chat_dir))
    whole = render_chat(session.tokenizer, CONTEXT + QUESTION)
    session.prefill(session.tokenizer.encode(whole, add_special_tokens=False), n_tokens=3)
    assert row["questions"][0]["dense"] == session.tokenizer.decode(session.dense_tokens)
