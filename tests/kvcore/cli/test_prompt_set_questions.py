"""Prompt sets of contexts and questions: `kvlens probe --prompts` asks each question of its context query-agnostic
(the context prefilled and compressed alone) or, with --query-aware, prefilled with the context."""

from __future__ import annotations

import csv
import json

import pytest

from kvcore.cli.main import main
from kvcore.engine.session import Session

CONTEXT = "def area(width, height):\n    return width * height\n" * 2
QUESTIONS = [{"question": "area(2, 3) returns", "answer": " 6"}, {"question": "width is", "answer": " w"}]


@pytest.fixture
def qset(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps({"id": "doc", "context": CONTEXT, "questions": QUESTIONS}) + "\n")
    return path


def _probe(model, qset, out, *extra):
    argv = ["probe", "--model", str(model), "--prompts", str(qset), "--methods", "snapkv", "--ratios", "0.5"]
    return main([*argv, "--csv", str(out), *extra])


@pytest.mark.parametrize("query_aware", [False, True])
def test_each_question_is_asked_of_its_context(model_dirs, qset, tmp_path, query_aware):
    out = tmp_path / "p.csv"
    assert _probe(model_dirs["llama"], qset, out, *(["--query-aware"] if query_aware else [])) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["prompt"], r["method"]) for r in rows] == [
        ("doc#1", "dense"),
        ("doc#1", "snapkv"),
        ("doc#2", "dense"),
        ("doc#2", "snapkv"),
    ]
    session = Session.load(str(model_dirs["llama"]))
    n = len(" 6") + 1
    if query_aware:  # context and question prefilled together
        session.prefill(CONTEXT + QUESTIONS[0]["question"], n_tokens=n)
        dense = session.dense_tokens
    else:  # the question appended to the dense cache of the context
        session.prefill(CONTEXT, n_tokens=1)
        dense = session.answer_tokens(None, QUESTIONS[0]["question"], n, "paper")
        assert int(rows[0]["prompt_tokens"]) == len(session.prompt_ids)
    assert rows[0]["continuation"] == session.tokenizer.decode(dense)


def test_a_question_set_is_refused_by_sweep_and_a_bad_question_named(model_dirs, qset, tmp_path, capsys):
    argv = [
        "sweep",
        "--model",
        str(model_dirs["llama"]),
        "--prompts",
        str(qset),
        "--csv",
        str(tmp_path / "s.csv"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "'doc#1' is a question about a context" in err and "kvlens probe --prompts" in err
    qset.write_text(json.dumps({"id": "doc", "context": CONTEXT, "questions": [{"q": "x"}]}) + "\n")
    assert _probe(tmp_path / "no-model", qset, tmp_path / "p.csv") == 2
    err = capsys.readouterr().err
    assert "set.jsonl:1: question 1 is not" in err and err.count("\n") == 1
