"""On the demo model's long-range prompts, query-aware eviction keeps the continuation where StreamingLLM loses it.

Figures measured here (papers' schedule, 12 greedy tokens, first divergence index; None = identical to dense):
- long_identifier.txt (611 tokens, `compute_exponential_moving_average` defined ~590 tokens earlier), r = 0.25:
  adakv 5 (`_exponential_` copied, then `smoothed_values(`), tova 2, snapkv / h2o / pyramidkv / streaming_llm / random 1. At r = 0.5 snapkv,
  adakv, tova and pyramidkv 5, streaming_llm 1; at r = 0.7 tova and random hold, streaming_llm still 1.
- repeated_block.txt (813 tokens), r = 0.5: snapkv, adakv, pyramidkv 8, tova 9, streaming_llm 4, h2o 2;
  r = 0.7: adakv None, streaming_llm 8.
"""

import pytest

from kvcore.resources import demo_model_dir, prompts_dir
from kvcore.session import CompressionConfig, Session

NAME = "_exponential_moving_average"


@pytest.fixture(scope="module")
def demo():
    return Session.load(str(demo_model_dir()))


def _regenerate(session, method, ratio):
    return session.regenerate(session.compress(CompressionConfig(method, ratio)))


def test_long_identifier_adakv_copies_further_than_streaming_llm(demo):
    demo.prefill((prompts_dir() / "long_identifier.txt").read_text(), n_tokens=12)
    assert demo.tokenizer.decode(demo.dense_tokens).startswith(NAME)
    kept = _regenerate(demo, "adakv", 0.25)
    lost = _regenerate(demo, "streaming_llm", 0.25)
    assert demo.tokenizer.decode(kept.tokens).startswith("_exponential_")
    assert not demo.tokenizer.decode(lost.tokens).startswith("_exponential")
    assert kept.metrics["first_divergence"] > lost.metrics["first_divergence"]


def test_repeated_block_adakv_holds_where_streaming_llm_breaks(demo):
    demo.prefill((prompts_dir() / "repeated_block.txt").read_text(), n_tokens=12)
    assert _regenerate(demo, "adakv", 0.7).metrics["first_divergence"] is None
    lost = _regenerate(demo, "streaming_llm", 0.7).metrics["first_divergence"]
    assert lost is not None and lost < 12
    half = [
        _regenerate(demo, m, 0.5).metrics["first_divergence"] for m in ("snapkv", "adakv", "streaming_llm")
    ]
    assert min(half[0], half[1]) > half[2]
