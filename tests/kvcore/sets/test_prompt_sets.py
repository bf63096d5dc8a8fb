"""Prompt sets: folders and JSONL read in a fixed order; every bad line refused with file:line and the fix."""

import json

import pytest

from kvcore.sets.prompt_sets import PromptItem, PromptSetError, load_prompts, set_digest


def test_folder_gives_text_files_sorted_by_name(tmp_path):
    for name, text in (("b.py", "def f(): pass"), ("a.txt", "alpha"), ("c.md", "# c"), ("skip.bin", "x")):
        (tmp_path / name).write_text(text)
    items = load_prompts(tmp_path)
    assert [p.id for p in items] == ["a.txt", "b.py", "c.md"]
    assert items[0] == PromptItem("a.txt", "alpha", None)


def test_jsonl_reads_ids_prompts_and_answers_skipping_blank_lines(tmp_path):
    f = tmp_path / "set.jsonl"
    f.write_text('{"id": "q1", "prompt": "one", "answer": "A"}\n\n{"id": 7, "prompt": "two"}\n')
    assert load_prompts(f) == [PromptItem("q1", "one", "A"), PromptItem("7", "two", None)]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "a", "prompt": "x"', "not JSON"),
        ('["a", "x"]', "a JSON list, not an object"),
        ('{"id": "a"}', "no 'prompt'"),
        ('{"prompt": "x"}', "no 'id'"),
        ('{"id": "a", "prompt": "  "}', "'prompt' must be non-empty text"),
        ('{"id": "a", "prompt": "x", "answer": 3}', "'answer' must be non-empty text"),
        ('{"id": "a", "prompt": "x", "answr": "y"}', "unknown key 'answr'"),
        ('{"id": "p1", "prompt": "again"}', "already used on line 1"),
    ],
)
def test_a_bad_line_names_file_line_and_the_fix(tmp_path, line, message):
    f = tmp_path / "set.jsonl"
    f.write_text(json.dumps({"id": "p1", "prompt": "fine"}) + "\n" + line + "\n")
    with pytest.raises(PromptSetError) as info:
        load_prompts(f)
    text = str(info.value)
    assert text.startswith(f"{f}:2: ") and message in text and "\n" not in text


def test_empty_missing_and_wrong_kinds_are_refused(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "notes.csv").write_text("a,b")
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "blank.txt").write_text(" \n")
    for path, message in (
        (tmp_path / "empty.jsonl", "no prompts"),
        (tmp_path / "notes.csv", "a .jsonl file"),
        (tmp_path / "nope.jsonl", "does not exist"),
        (folder, "blank.txt: empty"),
    ):
        with pytest.raises(PromptSetError, match=message):
            load_prompts(path)


def test_digest_changes_with_any_text():
    a = [PromptItem("x", "one"), PromptItem("y", "two", "2")]
    b = [PromptItem("x", "one"), PromptItem("y", "two", "3")]
    assert set_digest(a) == set_digest(list(a)) != set_digest(b)
