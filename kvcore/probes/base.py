"""What a needle probe is: a prompt that binds a short value to a name, buried in code, and asks for it at the end.

A *family* is one syntactic form of binding and asking (one file each in `families/`). The question's last line
uses the name the answer is bound to and ends exactly where the value must be written, so a model that retrieves
writes the value next; query-aware cache methods keep it because the asking query attends to the binding.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One form: `bind` and `ask` are format strings over {name} and {value}; `ask` ends before the value.

    `held_out` families never appear in the demo model's training data: tests measure recall on them.
    `style` picks how names are spelt ("snake", "upper", "camel", "kebab"); `values` what a value looks like
    ("alnum", "digits", "word"). Held-out families never use "word": under the papers' schedule the first token
    is the dense prefill's, and a word is finished from its first token (` vi` → `olet`, all the more after
    `border-color`), so a method that evicted the needle would still write it.
    """

    name: str
    bind: str
    ask: str
    held_out: bool = False
    style: str = "snake"
    values: str = "alnum"
    header: str = ""

    def binding(self, name: str, value: str) -> str:
        return self.bind.format(name=name, value=value)

    def question(self, name: str) -> str:
        return self.ask.format(name=name)


@dataclass(frozen=True)
class Probe:
    """A generated prompt and the continuation that counts as recall."""

    prompt: str
    answer: str
    name: str
    family: str
    seed: int
    depth: float
    n_tokens: int
    distractors: tuple[tuple[str, str], ...] = ()
    needle: str = ""

    @property
    def control_prompt(self) -> str:
        """The prompt with the needle's binding deleted: what the model writes from everything else is the floor
        a method's recall is read against (an evicted needle can still be carried by kept positions whose keys
        were computed while it was visible; a value written without any needle is a guess)."""
        return self.prompt.replace(self.needle, "", 1)

    @property
    def max_new_tokens(self) -> int:
        """Enough greedy tokens to write the value even one character per token, plus one."""
        return len(self.answer) + 1

    def recalled(self, continuation: str) -> bool:
        return recalls(self, continuation)


def recalls(probe: Probe, continuation: str) -> bool:
    """True when the continuation writes the whole value first (leading spaces allowed, nothing else)."""
    return writes_answer(probe.answer, continuation)


def writes_answer(answer: str, continuation: str) -> bool:
    """The recall rule on a bare answer (prompt sets score their `answer` field with it)."""
    return continuation.lstrip(" ").startswith(answer)
