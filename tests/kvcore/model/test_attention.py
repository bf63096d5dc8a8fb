"""kvcore.model.attention: installing it changes nothing for plain caches; observers see every layer's queries."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from kvcore.model import attention


def _logits(model, ids):
    cache = make_prompt_cache(model)
    out = model(mx.array([ids]), cache=cache)
    mx.eval(out)
    return np.array(out[0, -1])


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_install_leaves_plain_attention_bit_identical(loaded_models, arch):
    model, tok = loaded_models[arch]
    ids = tok.encode("def main(argv): return the quick brown fox")
    attention.uninstall(model)
    before = _logits(model, ids)
    attention.install(model)
    attention.install(model)
    after = _logits(model, ids)
    np.testing.assert_array_equal(before, after)


def test_observer_sees_every_layer_and_is_removed(loaded_models):
    model, tok = loaded_models["llama"]
    attention.install(model)
    ids = tok.encode("class Cache: def update(self, keys, values)")
    seen = []

    def observer(q, k, v, cache, scale, mask):
        seen.append((id(cache), q.shape, k.shape))

    cache = make_prompt_cache(model)
    with attention.observing(observer):
        mx.eval(model(mx.array([ids]), cache=cache))
    assert len(seen) == len(model.layers)
    assert len({s[0] for s in seen}) == len(model.layers)
    assert all(s[1][2] == len(ids) and s[2][2] == len(ids) for s in seen)
    mx.eval(model(mx.array([ids[:1]]), cache=cache))
    assert len(seen) == len(model.layers)


def test_install_refuses_model_without_shared_attention():
    import mlx.nn as nn

    with pytest.raises(attention.UnsupportedArchitecture, match="scaled_dot_product_attention"):
        attention.install(nn.Linear(2, 2))
