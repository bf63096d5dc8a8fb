"""The held-out scorer reads the training script's held-out files in order, EOS after each, and scores every
window's next tokens: top-1 and NLL match a direct computation, whatever the batch."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kvcore.model import loading
from scripts import heldout_top1
from scripts.train_demo_model import EOS, HELDOUT
from tests.model_factory import build_model


@pytest.fixture(scope="module")
def model_and_tokenizer(tmp_path_factory):
    folder = build_model(tmp_path_factory.mktemp("heldout") / "m", seed=3)
    model, tokenizer, _ = loading.load(str(folder))
    return model, tokenizer


@pytest.fixture
def stdlib_root(tmp_path):
    for i, rel in enumerate(HELDOUT):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"def f{i}(x):\n    return x * {i}\n" * (i + 1))
    return tmp_path


def test_files_are_encoded_in_order_each_followed_by_eos(model_and_tokenizer, stdlib_root):
    _, tokenizer = model_and_tokenizer
    ids = heldout_top1.heldout_ids(tokenizer, stdlib_root)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ends = np.flatnonzero(ids == eos)
    assert len(ends) == len(HELDOUT)
    first = tokenizer.encode((stdlib_root / HELDOUT[0]).read_text(), add_special_tokens=False)
    assert ids[: len(first)].tolist() == first and ends[0] == len(first)


def test_scores_match_a_direct_computation(model_and_tokenizer, stdlib_root):
    model, tokenizer = model_and_tokenizer
    ids = heldout_top1.heldout_ids(tokenizer, stdlib_root)
    seq = 64
    n = (len(ids) - 1) // seq
    assert n >= 3
    hits, nll = 0, 0.0
    for w in range(n):
        logits = np.array(model(mx.array(ids[None, w * seq : (w + 1) * seq])).astype(mx.float32))[0]
        target = ids[w * seq + 1 : (w + 1) * seq + 1]
        shifted = logits - logits.max(-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        hits += int((logits.argmax(-1) == target).sum())
        nll -= float(logp[np.arange(seq), target].sum())
    for batch in (1, 4):
        got = heldout_top1.score(model, ids, seq, batch=batch)
        assert got["tokens"] == n * seq
        assert got["top1"] == pytest.approx(hits / (n * seq))
        assert got["nll_per_token"] == pytest.approx(nll / (n * seq), rel=1e-4)
