"""Synthetic training documents that reward long-range retrieval, built on ordinary code.

The demo model learns retrieval and copying (induction heads) only when its corpus rewards them (DESIGN.md):
needles bound in the *training* probe families and asked for later, key–value tables with keys asked at the end,
blocks repeated verbatim, variables whose last assignment must be tracked, and long identifiers defined once and
used later. Every kind is interleaved with real code, so the model stays a code model. Held-out families never
appear here. MLX-free: the training script runs it on a machine without MLX.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvcore.probes.families import FAMILIES, TRAIN_FAMILIES
from kvcore.probes.forms import COMPARATORS, LEADS, generic_needle
from kvcore.probes.names import PREFIXES, SUFFIXES, WORDS, make_name, make_value


@dataclass(frozen=True)
class NeedleMix:
    """How needle documents are made; the defaults are the shipped model's documents (TRAINING.md).

    `same_form_share`: documents whose bindings all share one form, as a probe's distractors do (0.5 alone, in a
    continuation run, bought no recall on unseen forms). `dense_share`: documents with 6–16 bindings, each asked
    1–2 times, several times the retrieval targets of a plain needle document in the same tokens.
    `restate_share`: generic asks that repeat the binding's own line up to the value, under another owner or
    lead-in (`kvcore.probes.forms.generic_needle`), the copy a restated call or assignment asks for. A share of 0
    draws nothing from the generator, so the shipped stream stays byte-identical."""

    same_form_share: float = 0.0
    dense_share: float = 0.0
    restate_share: float = 0.0


SHIPPED_MIX = NeedleMix()

#: Share of each document kind among the synthetic documents; why these shares: TRAINING.md.
KINDS: dict[str, float] = {
    "needles": 0.50,
    "table": 0.15,
    "repeat": 0.12,
    "tracking": 0.08,
    "identifiers": 0.15,
}

TakeLines = Callable[[random.Random, int], list[str]]


def _closing(template: str) -> str:
    """The quote that follows {value} in a binding, so an answer in training is closed like the binding."""
    after = template.split("{value}", 1)[1]
    return after[0] if after and after[0] in "\"'`" else ""


def _lead(template: str) -> str:
    """A space before the value when the binding has one: asks end without it, as BPE tokenizes " value"."""
    return " " if " {value}" in template else ""


def _spread(rng: random.Random, n: int, lo: float, hi: float) -> list[float]:
    return sorted(rng.uniform(lo, hi) for _ in range(n))


def _needles(rng: random.Random, mix: NeedleMix) -> list[tuple[float, str]]:
    """1–8 bindings at any depth (6–16 in a dense document), some asked for later (each ask after its binding),
    distractors left unasked.

    30 % use the training families, the rest a randomly assembled form (`kvcore.probes.forms`). In a
    `same_form_share` of documents every binding shares one form, as a probe's distractors do: then only the
    name tells the asked binding from the others."""
    shared = mix.same_form_share > 0 and rng.random() < mix.same_form_share
    family = FAMILIES[rng.choice(TRAIN_FAMILIES)] if shared and rng.random() < 0.3 else None
    form_seed = rng.getrandbits(64) if shared else None
    dense = mix.dense_share > 0 and rng.random() < mix.dense_share
    count = rng.randint(6, 16) if dense else rng.randint(2 if shared else 1, 8)
    events, asked = [], set()
    for _ in range(count):
        fam = family if shared else (FAMILIES[rng.choice(TRAIN_FAMILIES)] if rng.random() < 0.3 else None)
        if fam is not None:
            name, value = make_name(rng, fam.style), make_value(rng, fam.values)
            binding, ask = fam.binding(name, value) + "\n", fam.question(name)
            answer = _lead(fam.bind) + value + _closing(fam.bind)
        else:
            form = random.Random(form_seed) if shared else None
            restate = mix.restate_share > 0 and rng.random() < mix.restate_share
            binding, ask, answer = generic_needle(rng, form, restate)
        if shared and ask in asked:
            continue  # the same name twice would make the question ambiguous
        asked.add(ask)
        at = rng.uniform(0.0, 0.8)
        events.append((at, binding))
        for _ in range(rng.choice((1, 1, 2)) if dense else rng.choice((0, 1, 1, 1, 2))):
            events.append((rng.uniform(at + 0.02, 0.97), ask + answer + "\n\n"))
    return events


def _table(rng: random.Random) -> list[tuple[float, str]]:
    """A dict literal of 6–40 keys; 1–4 keys looked up later in one of several forms."""
    var = rng.choice(("REGISTRY", "settings", "lookup", "CODES", "table", "mapping", "_defaults"))
    kind = rng.choice(("alnum", "digits", "word"))
    keys = list(
        dict.fromkeys(make_name(rng, rng.choice(("snake", "kebab"))) for _ in range(rng.randint(6, 40)))
    )
    values = [make_value(rng, kind) for _ in keys]
    quote = '"' if kind != "digits" else ""
    body = "".join(f'    "{k}": {quote}{v}{quote},\n' for k, v in zip(keys, values, strict=True))
    at = rng.uniform(0.0, 0.6)
    events = [(at, f"{var} = {{\n{body}}}\n\n")]
    forms = (
        '\nassert {var}["{key}"] == {q}',
        '\nvalue = {var}.get("{key}")  # {q}',
        '\nprint({var}["{key}"])  # -> {q}',
        '\nexpected["{key}"] = {q}',
    )
    for i in rng.sample(range(len(keys)), min(len(keys), rng.randint(1, 4))):
        if rng.random() < 0.5:
            ask = rng.choice(forms).format(var=var, key=keys[i], q=quote)
        else:
            ask = f'\n{rng.choice(LEADS)}{var}["{keys[i]}"] {rng.choice(COMPARATORS)} {quote}'
        events.append((rng.uniform(at + 0.05, 0.97), f"{ask}{values[i]}{quote}\n"))
    return events


def _repeat(rng: random.Random, take: TakeLines) -> list[tuple[float, str]]:
    """A block of 6–40 lines of code that appears again, verbatim, later in the document."""
    block = "".join(take(rng, rng.randint(6, 40) * 40))
    at = rng.uniform(0.0, 0.5)
    return [(at, block + "\n"), (rng.uniform(at + 0.1, 0.95), "\n" + block + "\n")]


def _tracking(rng: random.Random) -> list[tuple[float, str]]:
    """A variable assigned 2–5 times; asked for after the last assignment, which is the answer."""
    name = make_name(rng, "snake")
    kind = rng.choice(("digits", "alnum"))
    quote = '"' if kind == "alnum" else ""
    times = _spread(rng, rng.randint(2, 5), 0.0, 0.8)
    events, value = [], ""
    for t in times:
        value = make_value(rng, kind)
        events.append((t, f"{name} = {quote}{value}{quote}\n"))
    ask = rng.choice(("assert {n} == {q}", "print({n})  # {q}", "# now {n} = {q}"))
    events.append(
        (rng.uniform(times[-1] + 0.02, 0.97), "\n" + ask.format(n=name, q=quote) + value + quote + "\n")
    )
    return events


def _long_name(rng: random.Random) -> str:
    words = [rng.choice(("compute", "build", "load", "parse", "update", "resolve", "render", "validate"))]
    words += rng.sample(WORDS + PREFIXES + SUFFIXES, rng.randint(3, 6))
    name = "_".join(words)
    return "_" + name if rng.random() < 0.3 else name


def _identifiers(rng: random.Random, take: TakeLines) -> list[tuple[float, str]]:
    """Long functions defined once and called later: the long-identifier and `_invoice_totals` copies."""
    events = []
    for _ in range(rng.randint(1, 3)):
        name = _long_name(rng)
        args = ", ".join(rng.sample(("values", "items", "config", "limit", "path", "records", "decay"), 2))
        body = "".join("    " + line.lstrip() for line in take(rng, 200) if line.strip())
        at = rng.uniform(0.0, 0.6)
        events.append((at, f"def {name}({args}):\n{body}\n\n"))
        for _ in range(rng.randint(1, 3)):
            call = rng.choice(("result = {n}({a})", "    return {n}({a})", "totals = [{n}(x) for x in data]"))
            events.append((rng.uniform(at + 0.05, 0.97), "\n" + call.format(n=name, a=args) + "\n"))
    return events


def synthetic_document(
    rng: random.Random,
    take: TakeLines,
    n_chars: int,
    kind: str | None = None,
    mix: NeedleMix = SHIPPED_MIX,
) -> str:
    """About `n_chars` characters of code with one kind of retrieval task woven through it."""
    kind = kind or rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    if kind == "needles":
        events = _needles(rng, mix)
    elif kind == "table":
        events = _table(rng)
    elif kind == "repeat":
        events = _repeat(rng, take)
    elif kind == "tracking":
        events = _tracking(rng)
    elif kind == "identifiers":
        events = _identifiers(rng, take)
    else:
        raise ValueError(f"unknown synthetic document kind {kind!r}; known: {', '.join(KINDS)}")
    lines = take(rng, n_chars)
    cum, total = [], 0
    for line in lines:
        cum.append(total)
        total += len(line)
    placed: list[tuple[int, int, str]] = []
    for order, (at, text) in enumerate(events):
        target = at * total
        index = next((i for i, c in enumerate(cum) if c >= target), len(lines))
        while 0 < index < len(lines) and lines[index - 1].strip() and index < len(lines) - 1:
            index += 1  # a paragraph break keeps the surrounding code readable
            if index - 1 < len(cum) and cum[index - 1] - target > 400:
                break
        placed.append((index, order, text))
    out = list(lines)
    for index, _, text in sorted(placed, reverse=True):
        out.insert(index, text)
    return "".join(out)


def code_taker(texts: Sequence[str]) -> TakeLines:
    """`take(rng, n_chars)`: consecutive lines of a random training file, continuing into others as needed."""

    def take(rng: random.Random, n_chars: int) -> list[str]:
        out: list[str] = []
        size = 0
        while size < n_chars:
            lines = texts[rng.randrange(len(texts))].splitlines(keepends=True)
            if not lines:
                continue
            for line in lines[rng.randrange(len(lines)) :]:
                out.append(line)
                size += len(line)
                if size >= n_chars:
                    break
        return out

    return take
