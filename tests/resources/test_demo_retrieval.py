"""The demo model shows what KV compression does: retrieval that query-aware methods keep and others lose.

36 needle probes from the project's generator in the held-out template families (never in the training
data), on held-out standard-library filler, prompts of 500–1,800 tokens, needle depth uniform in [0.1, 0.9],
values of 1–3 tokens; one prefill per probe, every method recompressed from it, the papers' schedule.
Measured when the model was trained (TRAINING.md, CPU float32): the figures are in RECALL_MEASURED.
"""

from __future__ import annotations

import random

import pytest

from kvcore.probes import HELDOUT_FAMILIES, VALUE_TOKENS, make_probe
from kvcore.probes.run import probe_rows, recall_table
from kvcore.resources import demo_model_dir
from kvcore.session import CompressionConfig, Session

N_PROBES = 36
CONFIGS = {
    ("snapkv", 0.25): CompressionConfig("snapkv", 0.25),
    ("snapkv", 0.5): CompressionConfig("snapkv", 0.5),
    ("adakv", 0.25): CompressionConfig("adakv", 0.25),
    ("streaming_llm", 0.25): CompressionConfig("streaming_llm", 0.25),
    ("random", 0.25): CompressionConfig("random", 0.25),
}


def held_out_probes(tokenizer, n: int = N_PROBES, seed: int = 90_210):
    rng = random.Random(seed)
    return [
        make_probe(
            tokenizer,
            seed=seed + i,
            depth=rng.uniform(0.1, 0.9),
            n_tokens=rng.randint(560, 1750),
            family=HELDOUT_FAMILIES[i % len(HELDOUT_FAMILIES)],
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def recall():
    session = Session.load(str(demo_model_dir()))
    probes = held_out_probes(session.tokenizer)
    rows = []
    for probe in probes:
        rows += probe_rows(session, probe, list(CONFIGS.values()))
    table = recall_table(rows)
    out = {"dense": table[("dense", "", 1.0, 16)]}
    out.update({key: table[(key[0], "paper", key[1], 16)] for key in CONFIGS})
    out["_prompt_tokens"] = [r["prompt_tokens"] for r in rows if r["method"] == "dense"]
    out["_probes"] = probes
    print({k: v for k, v in out.items() if not k.startswith("_")})
    return out


def test_probes_are_what_the_issue_asks_for(recall):
    tokens = recall["_prompt_tokens"]
    assert len(tokens) >= 30 and min(tokens) >= 500 and max(tokens) <= 1800
    depths = [p.depth for p in recall["_probes"]]
    assert min(depths) >= 0.1 and max(depths) <= 0.9
    assert {p.family for p in recall["_probes"]} == set(HELDOUT_FAMILIES)
    assert VALUE_TOKENS == (1, 3)


def test_dense_recalls(recall):
    assert recall["dense"] >= 0.9


def test_snapkv_keeps_the_needle(recall):
    assert recall[("snapkv", 0.25)] >= 0.7
    assert recall[("snapkv", 0.5)] >= 0.8


def test_adakv_is_at_least_as_good_as_snapkv(recall):
    assert recall[("adakv", 0.25)] >= recall[("snapkv", 0.25)] - 0.05


def test_query_agnostic_methods_lose_it(recall):
    assert recall[("streaming_llm", 0.25)] <= 0.2
    assert recall[("random", 0.25)] <= 0.3
