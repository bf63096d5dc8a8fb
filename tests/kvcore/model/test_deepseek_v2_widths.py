"""deepseek_v2 caches per-head keys qk_nope + qk_rope wide and values v_head_dim wide, neither of them
hidden_size / num_attention_heads: the model's shapes, the group-size check and session files follow the cache."""

from __future__ import annotations

import re

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from kvcore.engine.session import CompressionConfig, Session
from kvcore.engine.session_file import open_session, save_session
from kvcore.engine.sweep import check_group_size
from tests.model_factory import ARCHS, build_model

PROMPT = "def main(argv): return sum(x * x for x in argv) The quick brown fox jumps over the lazy dog."
CONFIG = ARCHS["deepseek_v2"]
KEY_DIM = CONFIG["qk_nope_head_dim"] + CONFIG["qk_rope_head_dim"]
VALUE_DIM = CONFIG["v_head_dim"]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    s = Session.load(str(build_model(tmp_path_factory.mktemp("dsv2") / "m", "deepseek_v2", dtype="bfloat16")))
    s.prefill(PROMPT, n_tokens=3, chat_template=False)
    return s


def test_info_reports_the_widths_the_cache_stores(session):
    info = session.info
    cache = make_prompt_cache(session.model)
    mx.eval(session.model(mx.array([session.prompt_ids[:2]]), cache=cache))
    keys, values = cache[0].keys, cache[0].values
    assert (info.n_kv_heads, info.head_dim, info.value_dim) == (keys.shape[1], keys.shape[3], values.shape[3])
    assert (info.head_dim, info.value_dim) == (KEY_DIM, VALUE_DIM) and info.latent_rope_dim == 0
    # The case the config alone gets wrong: hidden / heads differs from both widths.
    assert CONFIG["hidden_size"] // CONFIG["num_attention_heads"] not in (KEY_DIM, VALUE_DIM)


def test_group_size_must_divide_both_packed_widths(session):
    # 32 divides the keys (64) and the values (32) though not hidden / heads (16): accepted, and it runs.
    fits = CompressionConfig("snapkv", 0.5, bits=4, group_size=32)
    check_group_size([fits], session.info.head_dim, session.info.value_dim)
    state = session.compress(fits)
    assert len(session.regenerate(state).tokens) == 3 and state.bytes_compressed < state.bytes_dense
    # 64 divides the keys but not the values: refused, naming the values' width and the sizes that fit ...
    wide = CompressionConfig("snapkv", 0.5, bits=4, group_size=64)
    message = f"group size 64 does not divide value width {VALUE_DIM} of this model: use one of [32]"
    with pytest.raises(ValueError, match=re.escape(message)):
        session.compress(wide)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_group_size([wide], session.info.head_dim, session.info.value_dim)
    # ... unless the values stay float: then only the keys' width counts.
    keys_only = CompressionConfig("snapkv", 0.5, bits=4, value_bits=16, group_size=64)
    check_group_size([keys_only], session.info.head_dim, session.info.value_dim)
    assert len(session.regenerate(session.compress(keys_only)).tokens) == 3


def test_session_file_round_trip(session, tmp_path):
    """The file's key and value widths are checked against the cache's own (64 and 32), and both pass."""
    save_session(tmp_path / "dsv2.kvlens", session)
    opened = Session.load(session.info.path)
    open_session(tmp_path / "dsv2.kvlens", opened)
    config = CompressionConfig("snapkv", 0.5)
    want, got = session.compress(config), opened.compress(config)
    assert (got.kept == want.kept).all() and not got.kept.all()
    assert opened.regenerate(got).tokens == session.regenerate(want).tokens
