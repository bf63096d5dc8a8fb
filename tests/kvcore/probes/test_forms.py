"""Randomly assembled needle forms: each binds the value to the name, asks by that name, and is never held out."""

from __future__ import annotations

import random
import re

from kvcore.probes import FAMILIES, HELDOUT_FAMILIES
from kvcore.probes.forms import generic_needle


def _samples(n: int) -> list[tuple[str, str, str]]:
    rng = random.Random(7)
    return [generic_needle(rng) for _ in range(n)]


def test_a_form_binds_asks_by_name_and_answers_with_the_value():
    shapes = r"[a-z]+_[a-z]+_[a-z]+|[A-Z]+_[A-Z]+_[A-Z]+|[a-z]+-[a-z]+-[a-z]+|[a-z]+[A-Z][a-z]+[A-Z][a-z]+"
    for binding, ask, answer in _samples(3000):
        value = answer.strip(" \t\"'`")
        assert value and value in binding, (binding, answer)
        name = re.search(shapes, binding).group(0)
        assert name in ask.splitlines()[-1], (binding, ask)
        assert not ask.endswith((" ", "\t")), ask
        assert binding.endswith("\n") and ask.startswith("\n")


def test_forms_are_diverse():
    shapes = {re.sub(r"[A-Za-z0-9]+", "w", ask.splitlines()[-1]) for _, ask, _ in _samples(3000)}
    assert len(shapes) >= 500


def test_no_form_contains_a_held_out_familys_fixed_text():
    text = "".join(b + a + ans for b, a, ans in _samples(20000))
    for family in HELDOUT_FAMILIES:
        fam = FAMILIES[family]
        for part in re.split(r"\{name\}|\{value\}", fam.bind + "\0" + fam.ask):
            part = part.replace("{{", "{").replace("}}", "}").strip("\0")
            if len(part.strip()) >= 8:
                assert part not in text, f"{family}: {part!r}"


def test_a_shared_form_changes_only_the_name_and_the_value():
    """Needles drawn with copies of one form generator are bound and asked the same way, as a probe's distractors."""
    rng = random.Random(3)
    for _ in range(200):
        seed = rng.getrandbits(64)
        (b1, a1, v1), (b2, a2, v2) = (generic_needle(rng, random.Random(seed)) for _ in range(2))
        skeleton = re.compile(r"[A-Za-z0-9]+")
        assert skeleton.sub("w", b1) == skeleton.sub("w", b2), (b1, b2)
        assert skeleton.sub("w", a1) == skeleton.sub("w", a2), (a1, a2)
        assert (b1, a1) != (b2, a2)
