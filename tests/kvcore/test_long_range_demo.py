"""On the demo model's long-range prompts, query-aware eviction keeps the continuation where StreamingLLM loses it.

Figures measured here (papers' schedule, 12 greedy tokens, first divergence index; None = identical to dense):
- long_identifier.txt (611 tokens; dense copies `compute_exponential_moving_average`, defined ~590 tokens earlier,
  as far as `_exponential_moving(values`): r = 0.5 snapkv and adakv 4 (`_exponential` copied), tova 2,
  pyramidkv / h2o / streaming_llm 1, random 8; r = 0.25 every method 1 (tova 2) — at a quarter of the cache no
  method keeps this identifier on this model.
- repeated_block.txt (813 tokens), r = 0.5: snapkv, adakv and tova None, pyramidkv 8, streaming_llm 11, h2o 4,
  random 2; r = 0.25: streaming_llm 11, adakv 8, tova 5, h2o 4, snapkv / pyramidkv 2, random 1 (the block being
  copied is recent, which is what streaming_llm keeps).
"""

import pytest

from kvcore.resources import demo_model_dir, prompts_dir
from kvcore.session import CompressionConfig, Session

NAME = "_exponential_moving"


@pytest.fixture(scope="module")
def demo():
    return Session.load(str(demo_model_dir()))


def _regenerate(session, method, ratio):
    return session.regenerate(session.compress(CompressionConfig(method, ratio)))


def test_long_identifier_query_aware_methods_copy_further_than_streaming_llm(demo):
    demo.prefill((prompts_dir() / "long_identifier.txt").read_text(), n_tokens=12)
    assert demo.tokenizer.decode(demo.dense_tokens).startswith(NAME)
    lost = _regenerate(demo, "streaming_llm", 0.5)
    assert not demo.tokenizer.decode(lost.tokens).startswith("_exponential")
    for method in ("snapkv", "adakv"):
        kept = _regenerate(demo, method, 0.5)
        assert demo.tokenizer.decode(kept.tokens).startswith("_exponential"), method
        assert kept.metrics["first_divergence"] > lost.metrics["first_divergence"], method


def test_repeated_block_query_aware_methods_hold_at_half_the_cache(demo):
    demo.prefill((prompts_dir() / "repeated_block.txt").read_text(), n_tokens=12)
    for method in ("snapkv", "adakv"):
        assert _regenerate(demo, method, 0.5).metrics["first_divergence"] is None, method
    lost = _regenerate(demo, "streaming_llm", 0.5).metrics["first_divergence"]
    assert lost is not None and lost < 12
    assert _regenerate(demo, "h2o", 0.5).metrics["first_divergence"] <= 4
