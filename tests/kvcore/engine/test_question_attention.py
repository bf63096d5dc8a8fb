"""A question's attention over its context: a distribution over context + question cut to the context (so each row
sums to at most 1), and each row's top positions ranked by weight, ties to the earlier position."""

import numpy as np
import pytest

from kvcore.defaults import CAPTURE_WINDOW
from kvcore.engine.question_attention import question_attention, top_positions


def test_rows_are_attention_over_the_context(loaded_models):
    model, tokenizer = loaded_models["llama"]
    context = tokenizer.encode("def area(width, height):\n    return width * height\n")
    question = tokenizer.encode("print(area(", add_special_tokens=False)
    attention = question_attention(model, context, question)
    layers = len(model.layers)
    assert attention.shape[0] == layers and attention.shape[2] == len(context)
    assert (attention >= 0).all() and (attention.sum(axis=-1) <= 1 + 1e-5).all()
    assert (attention.sum(axis=-1) > 0).all(), "the context gets some of the question's attention"
    with pytest.raises(ValueError, match="no tokens"):
        question_attention(model, context, [])
    with pytest.raises(ValueError, match="shorten it"):
        question_attention(model, context, question * (CAPTURE_WINDOW // len(question) + 1))


def test_top_positions_rank_by_weight_then_position():
    attention = np.array([[[0.1, 0.4, 0.4, 0.1], [np.nan] * 4]], dtype=np.float32)
    marked = top_positions(attention, 3)
    assert marked[0, 0].tolist() == [True, True, True, False], "ties to the earlier position"
    assert not marked[0, 1].any(), "a layer with no observation marks nothing"
