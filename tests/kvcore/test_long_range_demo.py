"""On the demo model's long-range prompts, score-based eviction keeps the continuation where StreamingLLM loses it.

Figures measured here (12 greedy tokens, first divergence index; None = identical to the dense continuation):
- repeated_block.txt, r = 0.5: adakv (over snapkv) None; streaming_llm 7. At r = 0.6 snapkv, tova and pyramidkv
  hold too; below 0.5 every method diverges within 8 tokens.
- long_identifier.txt (a name defined ~590 tokens earlier): h2o holds at r = 0.7; streaming_llm diverges at
  token 1 already at r = 0.9. At r <= 0.6 every method loses the name: this 15.7M-parameter model copies a
  long identifier only while most of the definition's neighbourhood is kept.
"""

import pytest

from kvcore.resources import demo_model_dir, prompts_dir
from kvcore.session import CompressionConfig, Session


@pytest.fixture(scope="module")
def demo():
    return Session.load(str(demo_model_dir()))


def _divergence(session, method, ratio):
    return session.regenerate(session.compress(CompressionConfig(method, ratio))).metrics["first_divergence"]


def test_repeated_block_adakv_holds_where_streaming_llm_breaks(demo):
    demo.prefill((prompts_dir() / "repeated_block.txt").read_text(), n_tokens=12)
    assert _divergence(demo, "adakv", 0.5) is None
    lost = _divergence(demo, "streaming_llm", 0.5)
    assert lost is not None and lost < 12


def test_long_identifier_h2o_holds_where_streaming_llm_breaks(demo):
    demo.prefill((prompts_dir() / "long_identifier.txt").read_text(), n_tokens=12)
    assert demo.tokenizer.decode(demo.dense_tokens).startswith("_exponential_moving_average(")
    assert _divergence(demo, "h2o", 0.7) is None
    assert _divergence(demo, "streaming_llm", 0.7) is not None
