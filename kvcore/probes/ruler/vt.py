"""Variable tracking (RULER vt): a chain of assignments hidden in the haystack; name every variable of it."""

from __future__ import annotations

from kvcore.probes.ruler.base import Parts, Task
from kvcore.probes.ruler.haystack import Haystack
from kvcore.probes.ruler.words import distinct, upper_name, variable

#: RULER's chain: one value passed through four hops, five variables.
N_VARIABLES = 5


def build(h: Haystack) -> Parts:
    rng = h.rng
    value = str(rng.randint(10_000, 99_999))
    if h.kind == "code":
        names = distinct(rng, upper_name, N_VARIABLES)
        needles = [
            f"{names[0]} = {value}\n",
            *(f"{b} = {a}\n" for a, b in zip(names, names[1:], strict=False)),
        ]
        question = f"\n# every name above bound to {value}, directly or through another name\nSAME = ["
        return Parts("", needles, question, names, ", ".join(names) + "]")
    names = distinct(rng, variable, N_VARIABLES)
    needles = [
        f"VAR {names[0]} = {value}. ",
        *(f"VAR {b} = VAR {a}. " for a, b in zip(names, names[1:], strict=False)),
    ]
    return Parts(
        head="Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n",
        needles=needles,
        question=f"\nQuestion: Find all variables that are assigned the value {value} in the text above.",
        answers=names,
        answer_text=" ".join(names),
        answer_prefix=(
            " Answer: According to the chain(s) of variable assignment in the text above, "
            f"{N_VARIABLES} variables are assigned the value {value}, they are: "
        ),
    )


TASK = Task("vt", "all", build, "variable tracking: every variable a chain of assignments binds to one value")
