"""`kvlens compress --context-file C --questions Q.jsonl`: compress the context once, answer every question from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcore.cli.main import main
from kvcore.resources import demo_model_dir

ROOT = Path(__file__).resolve().parents[3]
LOOKUP = 'assert ROUTES["cache_ibis_hash"] == "'


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    text = (ROOT / "resources" / "prompts" / "dict_lookup.txt").read_text()
    context, questions = tmp_path / "context.py", tmp_path / "questions.jsonl"
    context.write_text(text[: text.rindex(LOOKUP)])
    lines = [{"question": LOOKUP, "answer": 'fzi"'}, {"question": 'assert ROUTES["'}]
    questions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return context, questions


def _ask(files, capsys, method: str, ratio: float, *extra: str) -> dict:
    context, questions = files
    argv = ["compress", "--model", str(demo_model_dir()), "--context-file", str(context), *extra]
    argv += [
        "--questions",
        str(questions),
        "--method",
        method,
        "--ratio",
        str(ratio),
        "--tokens",
        "4",
        "--json",
    ]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_one_compression_answers_every_question_and_shows_what_snapkv_loses_without_it(files, capsys):
    full = _ask(files, capsys, "full", 1.0)
    assert [q["dense"] for q in full["questions"]] == [q["compressed"] for q in full["questions"]]
    assert full["accuracy_dense"] == full["accuracy_compressed"] == 1.0
    snapkv = _ask(files, capsys, "snapkv", 0.25)  # the question was not in its observation window
    assert snapkv["questions"][0]["dense_correct"] and not snapkv["questions"][0]["compressed_correct"]
    assert snapkv["accuracy_compressed"] == 0.0 and snapkv["questions"][1]["compressed_correct"] is None
    aware = _ask(
        files, capsys, "snapkv", 0.25, "--query-aware"
    )  # the question in its window: it keeps the value
    assert aware["questions"][0]["compressed_correct"] and aware["accuracy_compressed"] == 1.0
    assert [q["dense"] for q in aware["questions"]] == [q["dense"] for q in snapkv["questions"]]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no questions"),
        ('{"question": "a"}\n{"question": \n', "questions.jsonl:2: not JSON"),
        ('{"q": "a"}\n', "questions.jsonl:1: unknown key 'q'"),
        ('{"question": "a", "answer": 3}\n', "'answer' must be non-empty text or left out"),
    ],
)
def test_a_bad_question_file_is_one_line_before_the_model_loads(files, tmp_path, capsys, content, message):
    context, questions = files
    questions.write_text(content)
    argv = ["compress", "--model", str(tmp_path / "no-such-model"), "--context-file", str(context)]
    assert main([*argv, "--questions", str(questions)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
