"""make_probe: seeded, placed where asked, of the length asked, and asking for the value it bound."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from kvcore.probes import FAMILIES, HELDOUT_FAMILIES, TRAIN_FAMILIES, VALUE_TOKENS, make_probe, recalls
from kvcore.probes.names import WORDS
from kvcore.resources import demo_model_dir


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(str(demo_model_dir() / "tokenizer.json"))


def _ids(tok, text):
    return tok.encode(text).ids


def test_families_split_into_training_and_held_out():
    assert len(HELDOUT_FAMILIES) >= 5 and len(TRAIN_FAMILIES) >= 10
    assert not set(HELDOUT_FAMILIES) & set(TRAIN_FAMILIES)
    assert set(HELDOUT_FAMILIES) | set(TRAIN_FAMILIES) == set(FAMILIES)
    for fam in FAMILIES.values():
        assert "{name}" in fam.bind and "{value}" in fam.bind and "{name}" in fam.ask, fam.name
        assert not fam.question("x").endswith(" "), f"{fam.name}: BPE puts a trailing space on the value"


def test_same_arguments_same_probe_other_seed_other_value(tok):
    a = make_probe(tok, seed=3, depth=0.4, n_tokens=700, family="yaml_key")
    assert a == make_probe(tok, seed=3, depth=0.4, n_tokens=700, family="yaml_key")
    others = {
        make_probe(tok, seed=s, depth=0.4, n_tokens=700, family="yaml_key").answer for s in range(4, 12)
    }
    assert len(others | {a.answer}) >= 6


@pytest.mark.parametrize("family", HELDOUT_FAMILIES)
def test_binds_once_and_asks_by_name_at_the_end(tok, family):
    fam = FAMILIES[family]
    p = make_probe(tok, seed=11, depth=0.5, n_tokens=900, family=family)
    assert p.prompt.count(fam.binding(p.name, p.answer)) == 1
    assert p.prompt.endswith(fam.question(p.name))
    lo, hi = VALUE_TOKENS
    assert lo <= len(_ids(tok, p.answer)) <= hi
    names = [p.name, *(n for n, _ in p.distractors)]
    assert len(set(names)) == len(names) == 3
    for name, value in p.distractors:
        assert fam.binding(name, value) in p.prompt


@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("n_tokens", [600, 1700])
def test_needle_sits_at_the_depth_and_the_prompt_has_the_length(tok, depth, n_tokens):
    """On many seeds: a binding moved to a paragraph break moves a little, even inside a long function."""
    for seed in range(12):
        p = make_probe(tok, seed=seed, depth=depth, n_tokens=n_tokens, family="setattr_call")
        total = len(_ids(tok, p.prompt))
        assert 0.85 * n_tokens <= total <= 1.1 * n_tokens
        before = p.prompt[: p.prompt.index(FAMILIES["setattr_call"].binding(p.name, p.answer))]
        assert abs(len(_ids(tok, before)) / total - depth) < 0.12, seed


def test_recalls_wants_the_whole_value_first():
    p = make_probe(Tokenizer.from_file(str(demo_model_dir() / "tokenizer.json")), 1, 0.5, 600, "toml_entry")
    assert recalls(p, p.answer + "\n")
    assert recalls(p, " " + p.answer)
    assert not recalls(p, p.answer[:-1])
    assert not recalls(p, "x" + p.answer)
    assert p.max_new_tokens >= len(p.answer)


def test_bad_arguments_name_the_problem(tok):
    with pytest.raises(ValueError, match="unknown probe family 'nope'"):
        make_probe(tok, 0, 0.5, 600, "nope")
    with pytest.raises(ValueError, match="depth"):
        make_probe(tok, 0, 1.5, 600, "yaml_key")
    with pytest.raises(ValueError, match="at least 64"):
        make_probe(tok, 0, 0.5, 10, "yaml_key")


@pytest.mark.parametrize("family", [name for name, fam in FAMILIES.items() if fam.values == "word"])
def test_the_question_never_spells_the_answer(tok, family):
    """A word value can be a word of the name (`beacon` for `--batch-beacon-code`); such a probe is answered from
    the question, which every method keeps, so the generator draws another value."""
    for seed in range(200):
        p = make_probe(tok, seed=seed, depth=0.5, n_tokens=300, family=family)
        assert p.answer not in FAMILIES[family].question(p.name), (seed, p.answer, p.name)


@pytest.mark.parametrize("family", HELDOUT_FAMILIES)
def test_held_out_values_cannot_be_finished_from_their_first_token(tok, family):
    """Under the papers' schedule the first value token is the dense prefill's; a word value (` vi` → `olet`) is
    then finished from the lexicon by a cache that lost the needle, so the test's probes never ask for words."""
    for seed in range(30):
        answer = make_probe(tok, seed=seed, depth=0.5, n_tokens=300, family=family).answer
        assert answer not in WORDS, (family, seed, answer)
