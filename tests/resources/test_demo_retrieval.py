"""The demo model retrieves, and the methods order as the papers report: the issue's thresholds, measured.

`make eval` runs the full 30 + 40 probes (the `eval` marker); `make test` runs the first 8 + 10 of the same
sequences with thresholds set from their measured recall, enough to fail if retrieval or the ordering breaks.

Probes from the project's generator with seeds, names, values and filler the training never saw (filler is held-out
standard-library code), 560–1,750 tokens, needle depth uniform in [0.1, 0.9], values of 1–3 tokens, papers'
schedule. Measured when the model was made (TRAINING.md, "This model"):
- 30 probes in the 15 trained syntactic forms: dense 0.967, snapkv@25 % 0.967, snapkv@50 % 0.967, adakv@25 % 0.967,
  streaming_llm@25 % 0.200, random@25 % 0.067.
- 40 probes in the 10 held-out forms (templates the training never saw): dense 0.925, snapkv@25 % 0.875,
  snapkv@50 % 0.900, adakv@25 % 0.900, streaming_llm@25 % 0.150, random@25 % 0.000: the issue's targets (dense
  >= 0.9, snapkv >= 0.7 at 25 % and >= 0.8 at 50 %, streaming_llm <= 0.2, random <= 0.3) on unseen forms.
streaming_llm keeps the sinks and the most recent quarter, so it recalls the needles bound near the end. Under the
papers' schedule the first value token is the dense prefill's, so held-out values are random characters, never
words a cache could finish from that token (TRAINING.md, "Three probe fixes").
"""

from __future__ import annotations

import random

import pytest

from kvcore.engine.session import CompressionConfig, Session
from kvcore.probes import HELDOUT_FAMILIES, TRAIN_FAMILIES, make_probe
from kvcore.probes.scoring import DENSE, probe_rows
from kvcore.resources import demo_model_dir

SEED = 90_210
CONFIGS = {
    "snapkv25": CompressionConfig("snapkv", 0.25, schedule="paper"),
    "snapkv50": CompressionConfig("snapkv", 0.5, schedule="paper"),
    "adakv25": CompressionConfig("adakv", 0.25, schedule="paper"),
    "streaming25": CompressionConfig("streaming_llm", 0.25, schedule="paper"),
    "random25": CompressionConfig("random", 0.25, schedule="paper"),
}


def _recall(families: tuple[str, ...], n: int) -> dict[str, float]:
    """Recall per configuration."""
    session = Session.load(str(demo_model_dir()))
    rng = random.Random(SEED)
    hits = {name: 0 for name in (DENSE, *CONFIGS)}
    for i in range(n):
        probe = make_probe(
            session.tokenizer,
            seed=SEED + i,
            depth=rng.uniform(0.1, 0.9),
            n_tokens=rng.randint(560, 1750),
            family=families[i % len(families)],
        )
        assert 500 <= probe.n_tokens <= 1800
        rows = probe_rows(session, probe, list(CONFIGS.values()))
        for name, row in zip(hits, rows, strict=True):
            hits[name] += bool(row["recalled"])
    return {name: count / n for name, count in hits.items()}


#: The first probes of each sequence, in `make test`: enough to fail if retrieval or the ordering breaks. Measured
#: on this machine: trained forms 8/8 dense, snapkv@25 %, snapkv@50 %, adakv@25 %; streaming_llm 3/8, random 0/8;
#: held-out forms 10/10 dense and snapkv@50 %, 9/10 snapkv@25 % and adakv@25 %, streaming_llm 3/10, random 0/10.
N_TRAINED_SUBSET, N_HELD_OUT_SUBSET = 8, 10


@pytest.fixture(scope="module")
def trained_subset() -> dict[str, float]:
    return _recall(TRAIN_FAMILIES, N_TRAINED_SUBSET)


@pytest.fixture(scope="module")
def held_out_subset() -> dict[str, float]:
    return _recall(HELDOUT_FAMILIES, N_HELD_OUT_SUBSET)


def test_subset_of_trained_forms_retrieves_and_orders_the_methods(trained_subset):
    recall = trained_subset
    assert recall[DENSE] >= 0.875 and recall["snapkv50"] >= 0.875, recall
    assert recall["snapkv25"] >= 0.75 and recall["adakv25"] >= recall["snapkv25"] - 0.125, recall
    assert recall["random25"] <= 0.125 and recall["streaming25"] <= 0.5, recall
    assert recall["adakv25"] >= recall["streaming25"] + 0.4, recall


def test_subset_of_held_out_forms_retrieves_and_orders_the_methods(held_out_subset):
    recall = held_out_subset
    assert recall[DENSE] >= 0.9 and recall["snapkv50"] >= 0.8, recall
    assert recall["snapkv25"] >= 0.7 and recall["adakv25"] >= 0.7, recall
    assert recall["random25"] <= 0.1 and recall["streaming25"] <= 0.4, recall
    assert (
        min(recall["snapkv25"], recall["adakv25"]) >= max(recall["streaming25"], recall["random25"]) + 0.4
    ), recall


@pytest.fixture(scope="module")
def trained_forms() -> dict[str, float]:
    return _recall(TRAIN_FAMILIES, 30)


@pytest.fixture(scope="module")
def held_out_forms() -> dict[str, float]:
    return _recall(HELDOUT_FAMILIES, 40)


@pytest.mark.eval
def test_dense_recalls_unseen_needles(trained_forms):
    assert trained_forms[DENSE] >= 0.9, trained_forms


@pytest.mark.eval
def test_snapkv_keeps_what_the_question_asks_for(trained_forms):
    assert trained_forms["snapkv25"] >= 0.85, trained_forms
    assert trained_forms["snapkv50"] >= 0.9, trained_forms
    assert trained_forms["adakv25"] >= trained_forms["snapkv25"] - 0.05, trained_forms


@pytest.mark.eval
def test_query_blind_methods_lose_the_needle(trained_forms):
    assert trained_forms["random25"] <= 0.1, trained_forms
    assert trained_forms["streaming25"] <= 0.3, trained_forms
    assert trained_forms["adakv25"] >= trained_forms["streaming25"] + 0.6, trained_forms


@pytest.mark.eval
def test_held_out_forms_meet_the_issue_targets_and_keep_the_ordering(held_out_forms):
    recall = held_out_forms
    assert recall[DENSE] >= 0.9, recall
    assert recall["snapkv25"] >= 0.7, recall
    assert recall["snapkv50"] >= 0.8, recall
    assert recall["snapkv50"] >= recall[DENSE] - 0.05, recall
    assert recall["adakv25"] >= recall["snapkv25"] - 0.05, recall
    assert (
        min(recall["snapkv25"], recall["adakv25"]) >= max(recall["streaming25"], recall["random25"]) + 0.4
    ), recall
    assert recall["random25"] <= 0.2, recall
    assert recall["streaming25"] <= 0.2, recall
