"""Sample prompts: every shipped prompt has a note; a missing or broken notes file leaves notes empty."""

from __future__ import annotations

from kvcore.resources import prompts_dir
from kvcore.samples import sample_prompts


def test_every_shipped_sample_has_a_note_and_the_five_kinds_are_there():
    samples = sample_prompts(prompts_dir())
    names = {s.path.stem for s in samples}
    assert {"needle_in_code", "dict_lookup", "long_identifier", "repeated_block", "plain_code"} <= names
    for s in samples:
        assert len(s.note) > 30, s.path.name
        assert s.path.read_text(encoding="utf-8").strip()


def test_broken_or_missing_notes_give_empty_notes(tmp_path):
    (tmp_path / "a.txt").write_text("x = 1\n")
    assert [s.note for s in sample_prompts(tmp_path)] == [""]
    (tmp_path / "notes.json").write_text("{not json")
    assert [s.note for s in sample_prompts(tmp_path)] == [""]
    (tmp_path / "notes.json").write_text('["a list"]')
    assert [s.note for s in sample_prompts(tmp_path)] == [""]
    (tmp_path / "notes.json").write_text('{"a.txt": "look here"}')
    assert [(s.title, s.note) for s in sample_prompts(tmp_path)] == [("a", "look here")]
    assert sample_prompts(tmp_path / "missing") == []
