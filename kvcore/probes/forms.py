"""Randomly assembled binding and asking forms, so retrieval is learnt across syntaxes instead of per template.

A small model copies a name's value only in question shapes it has seen (TRAINING.md: 0.50 dense recall on
unseen forms when half the training needles came from 15 fixed templates). Here the binding and the question are
drawn independently from generic pieces of code syntax — how a name is written (bare, attribute, subscript, flag,
template variable), what separates it from its value, which quote, which question shape (comparison, call,
comment, print, restatement) and which line leads into it — so the only thing that stays constant is the task:
find the name asked about, copy what was bound to it. None of the pieces is a held-out family's (tests check).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from kvcore.probes.names import make_name, make_value

Ref = Callable[[str, str], str]

OBJECTS = (
    "self",
    "cfg",
    "config",
    "opts",
    "options",
    "settings",
    "ctx",
    "app.config",
    "state",
    "env",
    "params",
    "meta",
    "conf",
    "defaults",
    "os.environ",
    "registry",
    "spec",
    "CONFIG",
)

#: How the name is written where it is bound or asked about.
REFS: tuple[Ref, ...] = (
    lambda n, o: n,
    lambda n, o: n,
    lambda n, o: f"{o}.{n}",
    lambda n, o: f'{o}["{n}"]',
    lambda n, o: f"{o}['{n}']",
    lambda n, o: f'{o}.get("{n}")',
    lambda n, o: f'lookup("{n}")',
    lambda n, o: "$" + n,
    lambda n, o: "${" + n + "}",
    lambda n, o: "%" + n + "%",
    lambda n, o: "{{ " + n + " }}",
    lambda n, o: f"--{n}",
    lambda n, o: f'"{n}"',
    lambda n, o: f"'{n}'",
    lambda n, o: f"{o}::{n}",
    lambda n, o: f"{o}->{n}",
)

#: Composed references: a sigil, a bracket and an owner, each optional, so new spellings are combinations.
SIGILS = ("", "", "", ":", "$", "@", "%", "--", "-", "&", "#", "!", "*", "~", "?")
WRAPS = ("X", "[X]", "(X)", "<X>", '"X"', "'X'", "`X`", "{X}", "[[X]]", "{{X}}")
OWNER_JOINS = (".", "::", "->", " ", ":")

SEPARATORS = (" = ", "=", ": ", ":", " := ", " => ", " -> ", " is ", ", ", " ", "\t", " <- ", " == ")
QUOTES = ('"', '"', "'", "", "", "`")
FUNCS = (
    "register",
    "define",
    "store",
    "put",
    "emit",
    "record",
    "update",
    "declare",
    "bind",
    "save",
    "cache.put",
    "table.insert",
    "store.set",
    "env.set",
    "flags.define",
)
KEYWORDS = ("const", "let", "var", "static", "final", "val", "local", "export", "readonly", "set")
TAILS = ("", "", "", ";", ",", "  # default", " // set here")
COMPARATORS = ("==", "!=", "===", "is", "=", "eq", "equals", "->", ":", "=>", "<-", "~=")
LEADS = (
    "assert ",
    "if ",
    "elif ",
    "return ",
    "expect ",
    "check ",
    "while ",
    "ok = ",
    "# ",
    "// ",
    "",
    "not ",
)
CHECKS = (
    "assertEqual",
    "self.assertEqual",
    "check",
    "expect_eq",
    "verify",
    "compare",
    "same",
    "t.equal",
    "require",
    "match",
)
MATCHER_CALLS = ("expect", "assert_that", "check", "verify", "should", "want", "must", "ensure", "given")
MATCHERS = (
    ".toBe",
    ".toEqual",
    ".equals",
    ".is",
    ".matches",
    ".should_be",
    ".isEqualTo",
    ".eq",
    ".to_equal",
    ".contains",
    ".same_as",
    ".must_be",
)
CHAINS = ("", "", ".value", ".strip()", "[0]", ".get()", ".text", "()", ".data", ".first")
CONTEXTS = (
    "",
    "",
    "",
    "# check the value set above",
    "# later",
    "# restore the saved value",
    "// verify",
    "def test_values():",
    'if __name__ == "__main__":',
    "for _ in range(1):",
    "try:",
    "with lock:",
    "# round trip",
    "/* defaults */",
    "-- expected",
)

#: A restated binding's new owner (prepended to a line that starts with a name) and the line that leads into it.
RESTATE_OWNERS = (
    "self.",
    "other.",
    "copy.",
    "base.",
    "parent.",
    "cls.",
    "saved.",
    "this.",
    "prev.",
    "child.",
)
RESTATE_LEADS = (
    "",
    "",
    "# same as above\n",
    "# again, for the copy\n",
    "# restore the value set above\n",
    "    ",
    "// repeat\n",
    "if True:\n    ",
    "def restore():\n    ",
)


def _ref(rng: random.Random, name: str, obj: str) -> str:
    """The name written one of the usual ways, or composed from a sigil, a bracket and an owner."""
    if rng.random() < 0.5:
        return rng.choice(REFS)(name, obj)
    ref = rng.choice(WRAPS).replace("X", rng.choice(SIGILS) + name)
    if rng.random() < 0.4:
        ref = obj + ("" if ref[0] in "[(" else rng.choice(OWNER_JOINS)) + ref
    return ref


def _binding(rng: random.Random, name: str, obj: str, value: str, q: str) -> tuple[str, str, int]:
    """(the binding line, the separator it used, where its value starts) in one of several shapes."""
    shape = rng.random()
    if shape < 0.55:
        sep = rng.choice(SEPARATORS)
        head, tail = f"{_ref(rng, name, obj)}{sep}{q}", f"{q}{rng.choice(TAILS)}"
    elif shape < 0.65:
        head, tail, sep = f'{rng.choice(FUNCS)}("{name}", {q}', f"{q})", ", "
    elif shape < 0.75:
        head, tail, sep = f"{rng.choice(FUNCS)}({name}={q}", f"{q})", "="
    elif shape < 0.85:
        head, tail, sep = f"{rng.choice(KEYWORDS)} {name} = {q}", f"{q};", " = "
    elif shape < 0.92:
        head, tail, sep = f"<{name}>", f"</{name}>", ">"
    else:
        head, tail, sep = f"| {name} | {q}", f"{q} |", " | "
    return head + value + tail, sep, len(head)


def _ask(rng: random.Random, name: str, obj: str, sep: str, q: str) -> str:
    """A question that names `name` and ends where the value is written (an opening quote, or no space)."""
    ref = _ref(rng, name, obj)
    shape = rng.random()
    if shape < 0.25:
        ask = f"{rng.choice(LEADS)}{ref} {rng.choice(COMPARATORS)} "
    elif shape < 0.35:
        ask = f"{rng.choice(LEADS)}{rng.choice(MATCHER_CALLS)}({ref}){rng.choice(CHAINS)} {rng.choice(COMPARATORS)} "
    elif shape < 0.45:
        ask = f"{rng.choice(MATCHER_CALLS)}({ref}){rng.choice(CHAINS)}{rng.choice(MATCHERS)}("
    elif shape < 0.58:
        ask = f"{rng.choice(CHECKS)}({ref}, "
    elif shape < 0.7:
        comment = rng.choice(("#", "//", "/*", "--", ";", "<!--", "%", "'"))
        ask = f"{comment} {_ref(rng, name, obj)}{rng.choice(SEPARATORS)}"
    elif shape < 0.8:
        ask = f"{rng.choice(('print', 'echo', 'console.log', 'log.debug', 'puts'))}({ref})  # "
    else:
        ask = f"{ref}{sep}"
    context = rng.choice(CONTEXTS)
    indent = "    " if context.endswith(":") else ""
    return ("\n" + context if context else "") + "\n" + indent + ask


def _restated(rng: random.Random, binding: str, cut: int, value: str) -> tuple[str, str]:
    """(question, answer): the binding's line repeated up to its value, under another owner or after a lead-in."""
    head = binding[:cut]
    if head[:1].isalpha() and head.split(" ", 1)[0] not in KEYWORDS and rng.random() < 0.5:
        head = rng.choice(RESTATE_OWNERS) + head
    ask = "\n" + rng.choice(RESTATE_LEADS) + head
    closing = head[-1] if head[-1] in "\"'`" else ""
    bare = ask if closing else ask.rstrip(" \t")
    return bare, ask[len(bare) :] + value + closing


def generic_needle(
    rng: random.Random, form: random.Random | None = None, restate: bool = False
) -> tuple[str, str, str]:
    """(binding line, question, answer text): the question never ends in a space (BPE puts it on the value).

    With `form`, the syntax is drawn from it and only the name and value from `rng`: needles made with copies of
    one form generator share their syntax, the probes' setting where distractors are bound the same way. With
    `restate`, the question repeats the binding's own line up to the value (`_restated`)."""
    f = form or rng
    name = make_name(rng, f.choice(("snake", "upper", "camel", "kebab")))
    value = make_value(rng, f.choice(("alnum", "digits", "word")))
    obj = f.choice(OBJECTS)
    q = f.choice(QUOTES)
    binding, sep, cut = _binding(f, name, obj, value, q)
    if restate:
        return (binding + "\n", *_restated(rng, binding, cut, value))
    ask = _ask(f, name, obj, sep, q)
    if q and f.random() < 0.8:
        asked_q = q if f.random() < 0.75 else f.choice(('"', "'"))
        return binding + "\n", ask + asked_q, value + asked_q
    bare = ask.rstrip(" \t")
    return binding + "\n", bare, ask[len(bare) :] + q + value + q
