"""Decoding-time eviction: the rolling streaming_llm window and knorm, with rows and bytes really dropped."""

import json
import re

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from kvcore.cache import sparse as caches
from kvcore.capture.prefill import Cancelled
from kvcore.cli.main import main
from kvcore.engine.decoding import DecodingPolicy, decode_with_policy
from kvcore.engine.session import CompressionConfig, Session

PROMPT = (
    "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog. " * 2
)
N = 40


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=N)
    return s


def _row_bytes(session) -> int:
    """Bytes of one stored row of one kv-head, keys and values, float32 test weights."""
    return 2 * session.info.head_dim * 4


@pytest.mark.parametrize("schedule", ["paper", "mlx-lm"])
def test_rolling_window_keeps_sinks_and_most_recent(session, schedule):
    state = session.compress(CompressionConfig("streaming_llm", 0.5, schedule=schedule))
    policy = DecodingPolicy("streaming_llm", budget=12, interval=5, n_sink=4)
    run = decode_with_policy(session, state, policy, N)
    assert len(run.tokens) == N
    T = session.n_compressible(schedule)
    assert run.compressions[0].step == 0  # the prefill kept more than the budget: evicted before decoding
    assert [c.step for c in run.compressions[1:]] == list(range(5, len(run.steps) + 1, 5))
    for c in run.compressions:
        newest = T + c.step  # positions 0 … T + step − 1 have been written
        expected = [0, 1, 2, 3, *range(newest - 8, newest)]
        for layer in c.kept:
            for head in layer:
                assert head.tolist() == expected
        assert c.rows == [12] * session.info.n_layers
    assert state.cache[0].n_kept == len(np.flatnonzero(state.kept[0, 0]))  # the state itself is unchanged


def test_rows_never_exceed_budget_plus_interval_and_bytes_are_stored_arrays(session):
    state = session.compress(CompressionConfig("full", 1.0))
    policy = DecodingPolicy("streaming_llm", budget=10, interval=7, n_sink=2)
    run = decode_with_policy(session, state, policy, N)
    info = session.info
    assert run.max_cache_tokens == 10 + 7
    assert max(r for s in run.steps for r in s.rows) == 17
    for s in run.steps:
        assert all(r <= 17 for r in s.rows)
        assert s.bytes == sum(s.rows) * info.n_kv_heads * _row_bytes(session)
    for c in run.compressions:
        assert c.bytes == info.n_layers * info.n_kv_heads * 10 * _row_bytes(session)
    summary = run.bytes_summary()
    assert summary["max"] == info.n_layers * info.n_kv_heads * 17 * _row_bytes(session)
    assert summary["min"] == info.n_layers * info.n_kv_heads * 11 * _row_bytes(session)
    assert summary["last"] == run.steps[-1].bytes


@pytest.mark.parametrize("method", ["streaming_llm", "knorm"])
@pytest.mark.parametrize("schedule", ["paper", "mlx-lm"])
def test_budget_above_everything_is_plain_greedy(session, method, schedule):
    state = session.compress(CompressionConfig("snapkv", 0.5, schedule=schedule))
    policy = DecodingPolicy(method, budget=session.n_compressible(schedule) + N, interval=3)
    run = decode_with_policy(session, state, policy, N)
    assert run.compressions == []
    assert run.tokens == session.continuation(state, N)


def test_knorm_keeps_the_lowest_key_norms(session):
    state = session.compress(CompressionConfig("full", 1.0, schedule="mlx-lm"))
    policy = DecodingPolicy("knorm", budget=9, interval=4)
    run = decode_with_policy(session, state, policy, 13)
    first = run.compressions[0]
    assert first.step == 0
    dense = state.cache
    for layer, heads in enumerate(first.kept):
        keys = np.array(dense[layer].keys_and_values()[0][0]).astype(np.float64)
        norms = np.linalg.norm(keys, axis=-1)
        for h, kept in enumerate(heads):  # RoPE keeps norms, so a repeated token ties up to rounding
            assert len(kept) == 9 and kept.tolist() == sorted(kept.tolist())
            evicted = np.setdiff1d(np.arange(norms.shape[1]), kept)
            assert norms[h, kept].max() <= norms[h, evicted].min() * (1 + 1e-5)
    assert all(r <= 9 + 4 for s in run.steps for r in s.rows)
    assert len(run.compressions) == 1 + 13 // 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "h2o", "budget": 8}, "not one of"),
        ({"method": "streaming_llm", "budget": 4, "n_sink": 4}, "at least n_sink + 1 = 5"),
        ({"method": "streaming_llm", "budget": 8, "interval": 0}, "at least 1 token"),
        ({"method": "knorm", "budget": 0}, "give at least 1"),
    ],
)
def test_bad_policy_is_one_line(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        DecodingPolicy(**kwargs)


def test_packed_cache_decodes_under_a_policy(session):
    state = session.compress(CompressionConfig("snapkv", 0.5, bits=4, group_size=32))
    run = decode_with_policy(session, state, DecodingPolicy("knorm", budget=8, interval=4), 12)
    assert len(run.tokens) == 12 and run.max_cache_tokens <= 12
    assert all(isinstance(c, caches.SparseQuantizedKVCache) for c in state.cache)


@pytest.mark.parametrize("method", ["streaming_llm", "knorm"])
def test_ragged_prefill_state_evicts_per_head(session, method):
    state = session.compress(CompressionConfig("adakv", 0.4))
    held = [[p.tolist() for p in c.retained_positions] for c in state.cache]
    counts = [len(p) for heads in held for p in heads]
    assert len(set(counts)) > 1  # adakv's per-head budgets: the layers start ragged
    budget = (min(counts) + max(counts)) // 2
    run = decode_with_policy(session, state, DecodingPolicy(method, budget=budget, interval=5, n_sink=2), 16)
    assert run.max_cache_tokens <= budget + 5
    T, step = session.n_compressible("paper"), 0
    for c in run.compressions:
        for layer, heads in enumerate(c.kept):
            for h, kept in enumerate(heads):
                kept = kept.tolist()
                before = list(held[layer][h]) + list(range(T + step, T + c.step))
                assert len(kept) <= budget and kept == sorted(set(kept)) and set(kept) <= set(before)
                if len(before) <= budget:
                    assert kept == before  # a head within the budget loses nothing
                elif method == "streaming_llm":  # the sinks it still held and the newest budget − n_sink
                    assert kept == [p for p in before if p < 2] + before[-(budget - 2) :]
                else:
                    assert len(kept) == budget
        held, step = c.kept, c.step
    assert step > 0


def test_knorm_on_ragged_layers_scores_each_heads_own_rows(session):
    state = session.compress(CompressionConfig("adakv", 0.4))
    full = session.compress(CompressionConfig("full", 1.0))
    counts = [len(p) for c in state.cache for p in c.retained_positions]
    budget = (min(counts) + max(counts)) // 2
    run = decode_with_policy(session, state, DecodingPolicy("knorm", budget=budget), 2)
    first = run.compressions[0]
    assert first.step == 0
    for layer, heads in enumerate(first.kept):
        keys = np.array(full.cache[layer].keys_and_values()[0][0]).astype(np.float64)
        for h, kept in enumerate(heads):
            held = state.cache[layer].retained_positions[h]
            if len(held) <= budget:
                assert kept.tolist() == held.tolist()
                continue
            norms = np.linalg.norm(keys[h], axis=-1)
            evicted = np.setdiff1d(held, kept)
            assert len(kept) == budget and set(kept) <= set(held.tolist())
            assert norms[kept].max() <= norms[evicted].min() * (1 + 1e-5)


def test_knorm_ragged_later_steps_score_appended_rows(session):
    """Layer 0's keys depend only on the token and its position, so a dense pass over prompt + generated tokens
    gives every key the decode scored, appended rows of a ragged layer included."""
    state = session.compress(CompressionConfig("adakv", 0.4))
    counts = [len(p) for p in state.cache[0].retained_positions]
    budget = (min(counts) + max(counts)) // 2
    run = decode_with_policy(session, state, DecodingPolicy("knorm", budget=budget, interval=5), 40)
    dense = make_prompt_cache(session.model)
    session.model(mx.array([[*session.prompt_ids, *run.tokens]]), cache=dense)
    norms = np.linalg.norm(np.array(dense[0].keys[0, :, : dense[0].offset]).astype(np.float64), axis=-1)
    held, step, T = [p.tolist() for p in state.cache[0].retained_positions], 0, len(session.prompt_ids)
    scored_appended = False
    for c in run.compressions:
        for h, kept in enumerate(c.kept[0]):
            kept = kept.tolist()
            before = list(held[h]) + list(range(T + step, T + c.step))
            if len(before) <= budget:
                assert kept == before
                continue
            evicted = np.setdiff1d(before, kept)
            assert len(kept) == budget and norms[h, kept].max() <= norms[h, evicted].min() * (1 + 1e-4)
            scored_appended |= c.step > 0 and len(held[h]) < max(len(p) for p in held)
        held, step = c.kept[0], c.step
    assert scored_appended  # a head shorter than the padded width had appended rows scored


def test_cancel_stops_the_decode(session):
    state = session.compress(CompressionConfig("streaming_llm", 0.5))
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(Cancelled, match="cancelled after"):
        decode_with_policy(session, state, DecodingPolicy("streaming_llm", budget=8), N, should_cancel=cancel)
    assert len(calls) == 4


def test_cli_human_output_shows_the_decoding(model_dirs, prompt_file, capsys):
    argv = [
        "compress",
        "--model",
        str(model_dirs["llama"]),
        "--prompt-file",
        str(prompt_file),
        "--tokens",
        "8",
    ]
    argv += ["--decode-method", "streaming_llm", "--decode-budget", "6", "--decode-interval", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "decoding:   '" in out and "max_cache_tokens: 8" in out


def test_float_residual_is_refused(session):
    state = session.compress(CompressionConfig("snapkv", 0.5, bits=4, group_size=32, fp_recent=4))
    with pytest.raises(ValueError, match="fp_recent"):
        decode_with_policy(session, state, DecodingPolicy("knorm", budget=8), 4)


def test_cli_decode_policy_json(model_dirs, prompt_file, capsys):
    argv = [
        "compress",
        "--model",
        str(model_dirs["llama"]),
        "--prompt-file",
        str(prompt_file),
        "--tokens",
        "20",
    ]
    argv += ["--method", "full", "--ratio", "1.0", "--n-sink", "2", "--json"]
    argv += ["--decode-method", "streaming_llm", "--decode-budget", "8", "--decode-interval", "4"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decode_method"] == "streaming_llm" and out["decode_budget"] == 8
    assert out["max_cache_tokens"] == 8 + 4
    row = 2 * 32 * 4 * 2 * 4  # keys and values · head_dim · float32 · kv-heads · layers
    assert out["decode_bytes_max"] == 12 * row and out["decode_bytes_min"] == 9 * row
    assert out["decode_bytes_last"] in range(9 * row, 12 * row + 1, row)
    assert 0.0 <= out["decode_agreement"] <= 1.0
    divergence = out["decode_first_divergence"]
    assert divergence is None or 1 <= divergence < 20  # "paper": the first token is the dense prefill's


def test_cli_decode_budget_bigger_than_all_agrees_with_dense(model_dirs, prompt_file, capsys):
    argv = [
        "compress",
        "--model",
        str(model_dirs["llama"]),
        "--prompt-file",
        str(prompt_file),
        "--tokens",
        "10",
    ]
    argv += [
        "--method",
        "full",
        "--ratio",
        "1.0",
        "--json",
        "--decode-method",
        "knorm",
        "--decode-budget",
        "4096",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decode_agreement"] == 1.0 and out["decode_first_divergence"] is None
    assert out["decode_compressions"] == 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--decode-method", "h2o", "--decode-budget", "8"], "not one of"),
        (["--decode-method", "streaming_llm", "--decode-budget", "4"], "n_sink + 1 = 5"),
        (["--decode-method", "knorm", "--decode-budget", "8", "--decode-interval", "0"], "at least 1 token"),
        (["--decode-method", "knorm"], "--decode-method needs --decode-budget"),
        (["--decode-budget", "8"], "needs --decode-method"),
    ],
)
def test_cli_bad_decode_input_before_the_model_loads(tmp_path, prompt_file, capsys, extra, message):
    # the model folder does not exist: a refusal that names it would mean the model was looked at first
    argv = ["compress", "--model", str(tmp_path / "no-model"), "--prompt-file", str(prompt_file), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "no-model" not in err
