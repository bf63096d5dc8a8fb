"""RULER-format tasks: seeded, at the length asked (model tokens), answers in the context, scored as RULER scores."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from kvcore.probes.ruler import HAYSTACKS, make_sample, tasks
from kvcore.probes.ruler.base import string_match_all, string_match_part

LENGTH = 900


@pytest.fixture(scope="module")
def tok(loaded_models):
    return loaded_models["llama"][1]


def test_the_registry_holds_rulers_seven_task_types():
    assert set(tasks()) == {
        "niah_single",
        "niah_multikey",
        "niah_multivalue",
        "niah_multiquery",
        "vt",
        "cwe",
        "fwe",
    }


@pytest.mark.parametrize("haystack", HAYSTACKS)
@pytest.mark.parametrize("task", sorted(tasks()))
def test_a_sample_is_seeded_fits_its_length_and_holds_its_answers(tok, task, haystack):
    sample = make_sample(tok, task, haystack, LENGTH, seed=3)
    assert sample == make_sample(tok, task, haystack, LENGTH, seed=3)
    assert sample.context != make_sample(tok, task, haystack, LENGTH, seed=4).context
    n = len(tok.encode(sample.context + sample.feed(None)))
    assert 0.8 * LENGTH <= n <= LENGTH
    assert sample.answers and all(a in sample.context for a in sample.answers)
    assert sample.question not in sample.context and sample.max_new_tokens >= 3
    if task == "cwe":  # the ten answers are the ten most frequent words of the list
        words = re.findall(r'"(\w+)"' if haystack == "code" else r"\d+\. (\w+)", sample.context)
        assert {w for w, _ in Counter(words).most_common(10)} == set(sample.answers)
    if task == "fwe":
        body = sample.context.split('"""')[1] if haystack == "code" else sample.context.split("words. ")[1]
        top = [w for w, _ in Counter(body.split()).most_common(4)]
        assert top == ["....", *sample.answers]
    if task.startswith("niah") and haystack == "noise":
        assert "special magic numbers" in sample.question and sample.answer_prefix


def test_the_code_single_needle_is_a_probe_family(tok):
    from kvcore.probes.families import FAMILIES

    sample = make_sample(tok, "niah_single", "code", LENGTH, seed=1)
    forms = [f.ask.split("{name}") for f in FAMILIES.values()]
    assert any(
        sample.question.startswith(head) and sample.question.endswith(tail) for head, *_, tail in forms
    )


def test_string_match_scores_as_ruler():
    assert string_match_all("The numbers are 12 and 34.", ["12", "34", "56", "78"]) == 0.5
    assert string_match_all("AMBER, cedar", ["amber", "Cedar"]) == 1.0
    assert string_match_part("12 only", ["34", "12"]) == 1.0 and string_match_part("none", ["34"]) == 0.0


def test_a_length_too_short_is_one_line(tok):
    with pytest.raises(ValueError, match="too short for .*give at least"):
        make_sample(tok, "niah_multiquery", "noise", 60, 0)
    with pytest.raises(ValueError, match="unknown RULER task 'qa'"):
        make_sample(tok, "qa", "noise", LENGTH, 0)
