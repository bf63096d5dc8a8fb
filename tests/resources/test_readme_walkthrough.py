"""The README's "Try this first" walkthrough, run on the demo model: every value it quotes is what KV Lens writes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvcore.defaults import DEFAULT_CONTINUATION_TOKENS
from kvcore.engine.session import CompressionConfig, Session
from kvcore.resources import demo_model_dir

ROOT = Path(__file__).resolve().parents[2]
#: (method, ratio, schedule, the value the README quotes), in the README's order.
QUOTED = [
    ("snapkv", 0.25, "paper", 'fzi"'),
    ("adakv", 0.25, "paper", 'fzi"'),
    ("pyramidkv", 0.25, "paper", 'fzi"'),
    ("streaming_llm", 0.25, "paper", 'fcc"'),
    ("h2o", 0.25, "paper", 'f3z"'),
    ("tova", 0.25, "paper", 'fzd"'),
    ("random", 0.25, "paper", "f"),  # then a line break: the string is never closed
    ("adakv", 0.10, "paper", 'fzi"'),
    ("snapkv", 0.10, "paper", 'f"'),
]
DENSE = 'fzi"'


def _value(text: str) -> str:
    """The looked-up value as written: up to and including its closing quote, or to the line's end without one."""
    line = text.split("\n", 1)[0]
    return line[: line.index('"') + 1] if '"' in line else line


@pytest.fixture(scope="module")
def session() -> Session:
    session = Session.load(str(demo_model_dir()))
    session.prefill(
        (ROOT / "resources" / "prompts" / "dict_lookup.txt").read_text(), DEFAULT_CONTINUATION_TOKENS
    )
    return session


def _written(session: Session, method: str, ratio: float, schedule: str) -> str:
    state = session.compress(CompressionConfig(method, ratio, schedule=schedule))
    return _value(session.tokenizer.decode(session.regenerate(state).tokens))


def test_every_value_the_walkthrough_quotes_is_written(session):
    assert _value(session.tokenizer.decode(session.dense_tokens)) == DENSE
    written = [(m, r, s, _written(session, m, r, s)) for m, r, s, _ in QUOTED]
    assert written == QUOTED
    assert _written(session, "adakv", 0.10, "mlx-lm") != DENSE  # the mlx-lm schedule hides the question's end
    others = ("snapkv", "pyramidkv", "streaming_llm", "h2o", "tova", "random")
    assert all(_written(session, m, 0.10, "paper") != DENSE for m in others)  # "only adakv" at 10 %
    assert session.compress(
        CompressionConfig("pyramidkv", 0.25)
    ).budget_note  # its fallback, as the README says


def test_the_readme_quotes_the_same_values():
    text = (ROOT / "README.md").read_text()
    walkthrough = text[text.index("**Try this first**") : text.index("*needle_in_code*")]
    quoted = re.findall(r"`(f[^`]*)`", walkthrough)
    wrong = [v for m, r, _, v in QUOTED if v != DENSE]
    assert quoted == [DENSE, DENSE, *wrong[:4], DENSE, wrong[4]], quoted
