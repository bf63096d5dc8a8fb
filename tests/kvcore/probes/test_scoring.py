"""probe_rows on the demo model: one prefill per probe, every configuration scored from it."""

from __future__ import annotations

import pytest

from kvcore.engine.session import CompressionConfig, Session
from kvcore.probes import make_probe, recalls
from kvcore.probes.scoring import CONTROL, DENSE, PROBE_COLUMNS, probe_rows, recall_table
from kvcore.resources import demo_model_dir


@pytest.fixture(scope="module")
def demo():
    return Session.load(str(demo_model_dir()))


def test_one_prefill_serves_every_configuration(demo):
    probe = make_probe(demo.tokenizer, seed=2, depth=0.5, n_tokens=300, family="setattr_call")
    configs = [
        CompressionConfig("full", 1.0),
        CompressionConfig("snapkv", 0.25),
        CompressionConfig("random", 0.25),
    ]
    n = probe.max_new_tokens
    calls = demo.forward_calls
    demo.prefill(probe.prompt, n_tokens=n)
    prefill_calls = demo.forward_calls - calls
    calls = demo.forward_calls
    rows = probe_rows(demo, probe, configs)
    # one prefill (and its dense continuation), then each configuration only decodes n - 1 tokens ("paper")
    assert demo.forward_calls - calls == prefill_calls + len(configs) * (n - 1)
    assert [r["method"] for r in rows] == [DENSE, "full", "snapkv", "random"]
    assert all(set(PROBE_COLUMNS) - {"compression_ratio"} <= set(r) for r in rows)
    dense, full = rows[0], rows[1]
    assert full["continuation"] == dense["continuation"] and full["recalled"] == dense["recalled"]
    for row in rows:
        assert row["recalled"] == recalls(probe, row["continuation"])
        assert row["prompt_tokens"] == len(demo.prompt_ids)
    snap = demo.compress(configs[1])
    assert demo.tokenizer.decode(demo.continuation(snap, n)) == rows[2]["continuation"]
    assert rows[2]["compression_ratio"] < 0.5 < rows[1]["compression_ratio"]


def test_recall_table_is_the_share_recalled():
    rows = [
        {
            "method": "snapkv",
            "schedule": "paper",
            "retention_ratio": 0.25,
            "key_bits": 8,
            "value_bits": 4,
            "fp_recent": 64,
            "recalled": r,
        }
        for r in (True, False, True, True)
    ]
    assert recall_table(rows) == {("snapkv", "paper", 0.25, 8, 4, 64): 0.75}


def test_the_control_deletes_only_the_needle_and_the_model_then_cannot_write_it(demo):
    """The no-needle control: a trained-form probe the dense cache recalls is not recalled once its binding is gone,
    and the configurations are still scored on the first prefill (the control row comes last)."""
    probe = make_probe(demo.tokenizer, seed=4, depth=0.4, n_tokens=400, family="py_assign")
    assert probe.needle and probe.needle in probe.prompt and probe.answer in probe.needle
    assert probe.answer not in probe.control_prompt
    assert len(probe.control_prompt) == len(probe.prompt) - len(probe.needle)
    rows = probe_rows(demo, probe, [CompressionConfig("snapkv", 0.5)], control=True)
    assert [r["method"] for r in rows] == [DENSE, "snapkv", CONTROL]
    assert rows[0]["recalled"] and not rows[-1]["recalled"], rows
    assert rows[-1]["prompt_tokens"] < rows[0]["prompt_tokens"] == rows[1]["prompt_tokens"]
