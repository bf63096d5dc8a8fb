"""Synthetic training documents: each kind carries its task, and none uses a held-out family's form."""

from __future__ import annotations

import random
import re

import pytest

from kvcore.probes import FAMILIES, HELDOUT_FAMILIES, TRAIN_FAMILIES
from kvcore.probes.filler import filler_lines
from kvcore.probes.forms import RESTATE_OWNERS, generic_needle
from kvcore.probes.training import KINDS, NeedleMix, _needles, code_taker, synthetic_document


@pytest.fixture(scope="module")
def take():
    return code_taker(["".join(filler_lines())])


def _fixed_parts(template: str) -> list[str]:
    """The literal pieces of a template longer than a few characters (what makes the form recognisable)."""
    return [p for p in re.split(r"\{name\}|\{value\}", template) if len(p.strip()) >= 8]


def test_kinds_are_a_distribution():
    assert abs(sum(KINDS.values()) - 1.0) < 1e-9


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_is_code_of_about_the_length_asked(take, kind):
    doc = synthetic_document(random.Random(1), take, 6000, kind)
    assert 6000 <= len(doc) <= 30000
    assert "def " in doc or "class " in doc or "import " in doc


def _ask_pattern(ask: str) -> re.Pattern:
    shapes = r"[a-z]+_[a-z]+_[a-z]+|[A-Z]+_[A-Z]+_[A-Z]+|[a-z]+-[a-z]+-[a-z]+|[a-z]+[A-Z][a-z]+[A-Z][a-z]+"
    esc = re.escape(ask).replace(re.escape("{name}"), rf"(?P<name>{shapes})", 1)
    return re.compile(esc.replace(re.escape("{name}"), "(?P=name)") + r" ?(?P<value>[a-z0-9]+)")


def test_needles_are_asked_after_they_are_bound(take):
    """Every training-family ask in a needle document gives the value its name was bound to, earlier."""
    checked = 0
    for seed in range(30):
        doc = synthetic_document(random.Random(seed), take, 7000, "needles")
        for family in TRAIN_FAMILIES:
            fam = FAMILIES[family]
            for m in _ask_pattern(fam.ask).finditer(doc):
                binding = fam.binding(m["name"], m["value"])
                if doc.find(binding, m.start()) == m.start() + 1:
                    continue  # the binding itself (its ask restates it)
                assert binding in doc[: m.start()], f"{family}: {m.group(0)!r} asked before it was bound"
                checked += 1
    assert checked >= 20


def test_repeat_copies_a_block_and_tracking_asks_for_the_last_assignment(take):
    doc = synthetic_document(random.Random(2), take, 6000, "tracking")
    assigned = re.findall(r"^(\w+) = \"?(\w+)\"?$", doc, flags=re.M)
    name = assigned[-1][0]
    values = [v for n, v in assigned if n == name]
    ask = re.search(rf"(assert {name} ==|print\({name}\)  #|# now {name} =) \"?(\w+)", doc)
    assert ask is not None and ask.group(2) == values[-1]
    rep = synthetic_document(random.Random(3), take, 6000, "repeat")
    blocks = [b for b in rep.split("\n\n") if len(b) > 200]
    assert any(rep.count(b) >= 2 for b in blocks)


@pytest.mark.parametrize("mix", [NeedleMix(), NeedleMix(0.5, 0.5, 0.5)], ids=["shipped", "dense-restated"])
def test_no_document_uses_a_held_out_form(take, mix):
    rng = random.Random(0)
    text = "".join(synthetic_document(rng, take, 4000, mix=mix) for _ in range(150))
    for family in HELDOUT_FAMILIES:
        for part in _fixed_parts(FAMILIES[family].bind) + _fixed_parts(FAMILIES[family].ask):
            assert part not in text, f"{family}: {part!r} appears in training documents"


def test_same_form_needles_differ_only_by_name():
    """In a shared-form needle document every binding has one skeleton and a name of its own, so the question's
    name is what picks the answer (a probe's distractors); otherwise forms vary within a document."""
    skeleton = re.compile(r"[A-Za-z0-9]+")
    for shared_share, expect_same in ((1.0, True), (0.0, False)):
        same = 0
        for seed in range(60):
            bindings = [
                t
                for _, t in _needles(random.Random(seed), NeedleMix(same_form_share=shared_share))
                if not t.startswith("\n")
            ]
            shapes = {skeleton.sub("w", b) for b in bindings}
            if len(bindings) >= 2:
                same += len(shapes) == 1
            if expect_same:
                assert len(bindings) >= 2 and len(shapes) == 1, bindings
                assert len(set(bindings)) == len(bindings)
        assert expect_same or same < 20


def test_dense_needle_documents_bind_many_names_and_ask_each():
    for seed in range(40):
        events = _needles(random.Random(seed), NeedleMix(dense_share=1.0))
        bindings = [t for _, t in events if not t.startswith("\n")]
        asks = [t for _, t in events if t.startswith("\n")]
        assert 6 <= len(bindings) <= 16
        assert len(asks) >= len(bindings)


def test_a_restated_ask_repeats_the_binding_line_up_to_its_value():
    """The question's last line is the binding's own line (under another owner, maybe) and the answer completes
    it; the question never ends in white space (BPE puts the space on the value)."""
    rng = random.Random(5)
    owned = 0
    for _ in range(300):
        binding, ask, answer = generic_needle(rng, restate=True)
        line = ask.split("\n")[-1].lstrip()
        owner = next((o for o in RESTATE_OWNERS if line.startswith(o) and not binding.startswith(o)), "")
        owned += bool(owner)
        assert binding.startswith(line[len(owner) :] + answer), (binding, ask, answer)
        assert not ask.endswith((" ", "\t"))
    assert owned >= 30
