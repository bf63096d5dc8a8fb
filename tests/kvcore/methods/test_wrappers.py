"""The kvpress wrappers against NumPy readings of kvpress 0.5.5's definitions, on a tiny real model's prefill.

Inner scores are recomputed here from the cached keys and values (knorm, keydiff), so each test checks the
wrapper's own rule: chunks, stages, blocks, per-layer ratios, chains.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcore import methods
from kvcore.capture import prefill as capture
from kvcore.methods import selection

N_TOKENS = 90
RATIOS = (0.25, 0.5)


@pytest.fixture(scope="module")
def llama(loaded_models):
    model, _ = loaded_models["llama"]
    ids = [int(t) for t in np.random.default_rng(5).integers(1, model.args.vocab_size, N_TOKENS)]
    return model, capture.prefill_with_capture(model, ids).observations


def n_kept(n_tokens: int, ratio: float) -> int:
    return max(1, int(n_tokens * (1 - (1 - ratio))))


def keys_of(obs) -> np.ndarray:
    return np.array(obs.keys).astype(np.float64)


def values_of(obs) -> np.ndarray:
    return np.array(obs.values).astype(np.float64)


def knorm(k: np.ndarray) -> np.ndarray:
    return -np.linalg.norm(k, axis=-1)


def keydiff(k: np.ndarray) -> np.ndarray:
    unit = k / np.linalg.norm(k, axis=-1, keepdims=True)
    anchor = unit.mean(axis=1, keepdims=True)
    return -(k * anchor).sum(-1) / (np.linalg.norm(k, axis=-1) * np.linalg.norm(anchor, axis=-1))


def top(row: np.ndarray, n: int) -> list[int]:
    return sorted(np.argsort(-row, kind="stable")[:n].tolist())


def kept(observations, name: str, ratio: float, **params):
    return selection.select(selection.rank(observations, methods.get(name, **params)), ratio)


def as_lists(layer) -> list[list[int]]:
    return [np.asarray(h).tolist() for h in layer]


def test_chunkkv_keeps_the_chunks_with_the_highest_mean_score(llama):
    _, observations = llama
    for ratio in RATIOS:
        for obs, got in zip(
            observations, kept(observations, "chunkkv-knorm", ratio, chunk_length=7), strict=True
        ):
            per_position = knorm(keys_of(obs)).sum(axis=0)
            starts = list(range(0, N_TOKENS, 7))
            means = np.array([per_position[s : s + 7].mean() for s in starts])
            chosen = top(means, max(1, int(len(starts) * (1 - (1 - ratio)))))
            want = sorted(t for c in chosen for t in range(starts[c], min(starts[c] + 7, N_TOKENS)))
            assert got.tolist() == want


def test_chunkkv_scores_snapkv_window_as_kvpress_pads_it(llama):
    _, observations = llama
    ranking = selection.rank(observations, "chunkkv")
    for layer, got in zip(ranking.layers, selection.select(ranking, 0.25), strict=True):
        padded = layer.scores.astype(np.float64).copy()
        window = np.arange(N_TOKENS - 64, N_TOKENS)
        padded[:, window] = np.delete(layer.scores, window, axis=1).max() + 1
        means = np.array([padded.sum(0)[s : s + 20].mean() for s in range(0, N_TOKENS, 20)])
        chosen = top(means, int(5 * 0.25))
        assert got.tolist() == sorted(t for c in chosen for t in range(20 * c, min(20 * c + 20, N_TOKENS)))


def output_norms(model, layer: int, obs) -> np.ndarray:
    """‖W_o,h·v‖₁ averaged over each GQA group, from the model's own o_proj weights."""
    weight = np.array(model.layers[layer].self_attn.o_proj.weight).astype(np.float64)
    values = values_of(obs)
    head_dim, group = values.shape[-1], obs.n_q_heads // obs.n_kv_heads
    per_q = [
        np.abs(values[h // group] @ weight[:, h * head_dim : (h + 1) * head_dim].T).sum(-1)
        for h in range(obs.n_q_heads)
    ]
    return np.array(per_q).reshape(obs.n_kv_heads, group, -1).mean(axis=1)


def two_stages(scores, norms, first: list[int], n: int) -> list[int]:
    rescaled = (scores + 1e-4) * norms
    rest = [t for t in np.argsort(-rescaled, kind="stable") if t not in set(first)]
    return sorted([*first, *rest[: n - len(first)]])


def test_criticalkv_keeps_first_stage_then_rescaled_scores(llama):
    model, observations = llama
    for ratio in RATIOS:
        got = kept(observations, "criticalkv-knorm", ratio)
        for layer, obs in enumerate(observations):
            scores, norms = knorm(keys_of(obs)), output_norms(model, layer, obs)
            first = max(1, int((1 - (1 - ratio)) * N_TOKENS * 0.5))
            n = n_kept(N_TOKENS, ratio)
            want = [two_stages(scores[h], norms[h], top(scores[h], first), n) for h in range(obs.n_kv_heads)]
            assert as_lists(got[layer]) == want


def test_critical_adakv_spreads_budgets_then_two_stages(llama):
    model, observations = llama
    for ratio in RATIOS:
        got = kept(observations, "critical_adakv-knorm", ratio)
        for layer, obs in enumerate(observations):
            scores, norms = knorm(keys_of(obs)), output_norms(model, layer, obs)
            n, heads = n_kept(N_TOKENS, ratio), obs.n_kv_heads
            safe = max(1, int(n * 0.2))
            priority = scores.copy()
            for h in range(heads):
                priority[h, top(scores[h], safe)] = np.inf
            slots = sorted((-priority[h, t], h * N_TOKENS + t) for h in range(heads) for t in range(N_TOKENS))
            budgets = np.bincount([s // N_TOKENS for _, s in slots[: n * heads]], minlength=heads)
            want = [
                two_stages(scores[h], norms[h], top(priority[h], max(safe, int(b * 0.5))), int(b))
                for h, b in enumerate(budgets)
            ]
            assert as_lists(got[layer]) == want
            assert sum(budgets) == n * heads


@pytest.mark.parametrize("name", ["criticalkv-knorm", "critical_adakv-knorm"])
def test_score_view_of_criticalkv_is_the_ranking_it_keeps_by(llama, name):
    """selection.final_scores (the heatmap's Score view): each head's top len(kept) of it are the kept positions,
    first-stage positions rank above the rest, and the rest are (score + epsilon)·‖W_o·v‖₁."""
    model, observations = llama
    ranking = selection.rank(observations, methods.get(name))
    shown = selection.final_scores(ranking, 0.25)
    for layer, (obs, got, final) in enumerate(
        zip(observations, selection.select(ranking, 0.25), shown, strict=True)
    ):
        rescaled = (knorm(keys_of(obs)) + 1e-4) * output_norms(model, layer, obs)
        for h, positions in enumerate(got):
            by_final = np.argsort(-final[h], kind="stable")[: len(positions)]
            assert sorted(by_final.tolist()) == np.asarray(positions).tolist()
            lifted = final[h] > rescaled[h].max() * (1 + 1e-5) + 1e-6
            assert 0 < lifted.sum() < len(positions)  # the first stage, above every rescaled score
            np.testing.assert_allclose(final[h][~lifted], rescaled[h][~lifted], rtol=1e-4, atol=1e-6)


def test_chunk_compresses_each_chunk_with_its_own_keydiff(llama):
    _, observations = llama
    for ratio in RATIOS:
        got = kept(observations, "chunk-keydiff", ratio, chunk_length=24)
        for layer, obs in enumerate(observations):
            k = keys_of(obs)
            for h in range(obs.n_kv_heads):
                want = []
                for s in range(0, N_TOKENS, 24):
                    part = keydiff(k[h : h + 1, s : s + 24])[0]
                    want += [s + t for t in top(part, max(1, int(len(part) * (1 - (1 - ratio)))))]
                assert got[layer][h].tolist() == sorted(want)


def test_block_rescores_kept_plus_each_block(llama):
    _, observations = llama
    for ratio in RATIOS:
        got = kept(observations, "block-keydiff", ratio, block_size=16)
        n = n_kept(N_TOKENS, ratio)
        for layer, obs in enumerate(observations):
            k = keys_of(obs)
            for h in range(obs.n_kv_heads):
                keep = list(range(n))
                for s in range(n, N_TOKENS, 16):
                    current = keep + list(range(s, min(s + 16, N_TOKENS)))
                    scores = keydiff(k[h : h + 1, current])[0]
                    keep = [current[i] for i in np.argsort(-scores, kind="stable")[:n]]
                assert got[layer][h].tolist() == sorted(keep)


def test_per_layer_compression_keeps_each_layers_own_ratio(llama):
    _, observations = llama
    ratios = (0.1, 0.3, 0.5, 0.7)
    got = kept(observations, "per_layer_compression-knorm", 0.25, layer_ratios=list(ratios))
    for obs, layer, r in zip(observations, got, ratios, strict=True):
        scores = knorm(keys_of(obs))
        assert as_lists(layer) == [top(scores[h], n_kept(N_TOKENS, r)) for h in range(obs.n_kv_heads)]
    plain = kept(observations, "knorm", 0.25)
    for a, b in zip(kept(observations, "per_layer_compression-knorm", 0.25), plain, strict=True):
        np.testing.assert_array_equal(a, b)  # no list: the run's ratio everywhere


def test_composed_chain_scores_what_the_first_stage_kept(llama):
    _, observations = llama
    for ratio in RATIOS:
        got = kept(observations, "knorm+keydiff", ratio)
        step = ratio ** (1 / 2)
        for obs, layer in zip(observations, got, strict=True):
            k = keys_of(obs)
            for h in range(obs.n_kv_heads):
                first = top(knorm(k)[h], n_kept(N_TOKENS, step))
                second = keydiff(k[h : h + 1, first])[0]
                want = [first[i] for i in top(second, n_kept(len(first), step))]
                assert layer[h].tolist() == sorted(want)


def rotate_half_rope(x: np.ndarray, delta: np.ndarray, base: float) -> np.ndarray:
    """Non-traditional RoPE (halves rotated together) of rows x [n, D] through angles delta · base^(−2j/D)."""
    half = x.shape[-1] // 2
    theta = delta[:, None] * base ** (-np.arange(half) * 2 / x.shape[-1])
    a, b = x[:, :half], x[:, half:]
    return np.concatenate(
        [a * np.cos(theta) - b * np.sin(theta), a * np.sin(theta) + b * np.cos(theta)], axis=1
    )


def test_key_rerotation_stores_rotated_keys_and_still_generates(model_dirs):
    from kvcore.engine.session import CompressionConfig, Session

    session = Session.load(str(model_dirs["llama"]))
    ids = [int(t) for t in np.random.default_rng(6).integers(1, session.model.args.vocab_size, 60)]
    session.prefill(ids, 3, chat_template=False)
    plain = session.compress(CompressionConfig("knorm", 0.25, schedule="paper"))
    moved = session.compress(CompressionConfig("key_rerotation-knorm", 0.25, schedule="paper"))
    np.testing.assert_array_equal(moved.kept, plain.kept)
    assert moved.bytes_compressed == plain.bytes_compressed  # the same rows, rotated in place
    for layer, (a, b) in enumerate(zip(plain.cache, moved.cache, strict=True)):
        kept = [np.flatnonzero(plain.kept[layer, h]) for h in range(2)]
        n = len(kept[0])
        np.testing.assert_array_equal(np.array(b.values[0, :, :n]), np.array(a.values[0, :, :n]))
        for h in range(2):
            dense = np.array(a.keys[0, h, :n]).astype(np.float64)
            want = rotate_half_rope(dense, np.arange(n) - kept[h], 10000.0)
            np.testing.assert_allclose(np.array(b.keys[0, h, :n]), want, rtol=1e-4, atol=1e-4)
    tokens = session.continuation(moved, 3)
    assert len(tokens) == 3


def last_query_attention(obs, n_last: int) -> np.ndarray:
    """Mean over query heads and the last n_last queries of their causal softmax over the prompt (float64)."""
    q = np.array(obs.window_queries[:, -n_last:]).astype(np.float64) * obs.scale
    k = keys_of(obs)
    group = obs.n_q_heads // obs.n_kv_heads
    rows = []
    for h in range(obs.n_q_heads):
        logits = q[h] @ k[h // group].T  # [n_last, T]
        logits[np.arange(N_TOKENS)[None, :] > np.arange(N_TOKENS - n_last, N_TOKENS)[:, None]] = -np.inf
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        rows.append(p / p.sum(axis=1, keepdims=True))
    return np.mean(rows, axis=(0, 1))


def test_simlayerkv_keeps_initial_and_recent_in_lazy_layers_only(llama):
    _, observations = llama
    shares = []
    for obs in observations:
        before = last_query_attention(obs, 2)[: N_TOKENS - 2]
        shares.append(before[:4].sum() + before[-20:].sum())
    threshold = float(np.median(shares))
    got = kept(observations, "simlayerkv", 0.25, lazy_threshold=threshold, n_last=2, n_recent=20)
    lazy = []
    for share, layer in zip(shares, got, strict=True):
        want = [*range(4), *range(N_TOKENS - 18, N_TOKENS)] if share > threshold else list(range(N_TOKENS))
        assert layer.tolist() == want
        lazy.append(share > threshold)
    assert any(lazy) and not all(lazy)
    assert all(
        len(layer) == N_TOKENS for layer in kept(observations, "simlayerkv", 0.25)
    )  # 1.0: no layer lazy


def test_dms_evicts_below_the_threshold_outside_the_window(llama):
    _, observations = llama
    threshold = float(np.median(knorm(keys_of(observations[0]))[:, : N_TOKENS - 16]))
    got = kept(observations[:1], "dms-knorm", 0.25, threshold=threshold, sliding_window_size=16)[0]
    scores = knorm(keys_of(observations[0]))
    for h in range(2):
        want = [t for t in range(N_TOKENS - 16) if scores[h, t] >= threshold] + list(
            range(N_TOKENS - 16, N_TOKENS)
        )
        assert got[h].tolist() == want


def finch_scores(obs, window: int) -> np.ndarray:
    """The window's causal attention rows times their positions, averaged over the window and each GQA group."""
    q = np.array(obs.window_queries[:, -window:]).astype(np.float64) * obs.scale
    k = keys_of(obs)
    group = obs.n_q_heads // obs.n_kv_heads
    votes = []
    for h in range(obs.n_q_heads):
        logits = q[h] @ k[h // group].T
        positions = np.arange(N_TOKENS - window, N_TOKENS)
        logits[np.arange(N_TOKENS)[None, :] > positions[:, None]] = -np.inf
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        votes.append((p[:, : N_TOKENS - window] * positions[:, None]).mean(axis=0))
    return np.array(votes).reshape(obs.n_kv_heads, group, -1).mean(axis=1)


def test_finch_keeps_the_question_and_its_position_weighted_votes(llama):
    _, observations = llama
    for ratio, chunk in ((0.5, 0), (0.5, 40)):
        got = kept(observations, "finch", ratio, window=16, selection_chunk=chunk)
        for obs, layer in zip(observations, got, strict=True):
            votes = finch_scores(obs, 16)
            padded = np.concatenate([votes, np.full((obs.n_kv_heads, 16), votes.max() + 1)], axis=1)
            for h in range(obs.n_kv_heads):
                if not chunk:
                    want = top(padded[h], n_kept(N_TOKENS, ratio))
                else:
                    want = [
                        s + t
                        for s in range(0, N_TOKENS, chunk)
                        for t in top(padded[h, s : s + chunk], n_kept(len(padded[h, s : s + chunk]), ratio))
                    ]
                assert layer[h].tolist() == sorted(want)


def test_a_list_parameter_survives_a_json_round_trip():
    import json

    from kvcore.engine.session import CompressionConfig

    config = CompressionConfig("per_layer_compression", 0.25, params={"layer_ratios": (0.1, 0.2, 0.3, 0.4)})
    again = CompressionConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config and hash(again) == hash(config)
    assert again.method_instance.values()["layer_ratios"] == (0.1, 0.2, 0.3, 0.4)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("chunk-snapkv", {}, "needs a scorer of keys and values alone.*use chunk-knorm"),
        ("block-h2o", {}, "needs a scorer of keys and values alone"),
        ("chunkkv-tova", {}, "needs a per-head scorer"),
        (
            "chunk-knorm",
            {"chunk_length": 1024},
            "chunk_length 1024 is longer than the prompt .90 tokens.: set",
        ),
        ("chunkkv", {"chunk_length": 91}, "chunk_length 91 is longer than the prompt"),
        (
            "per_layer_compression",
            {"layer_ratios": (0.5, 0.5)},
            "has 2 values but the model has 4 layers: give",
        ),
        ("per_layer_compression", {"layer_ratios": (0.5, 0.0)}, r"ratio must be in \(0, 1\]"),
    ],
)
def test_bad_parameters_say_how_to_fix_them(llama, name, params, message):
    _, observations = llama
    with pytest.raises(ValueError, match=message):
        kept(observations, name, 0.25, **params)


WRAPPERS = {
    "chunkkv": [],
    "criticalkv": [],
    "critical_adakv": [],
    "chunk": ["chunk_length=16"],
    "block": [],
    "per_layer_compression": ["layer_ratios=0.1,0.2,0.3,0.4"],
    "snapkv+knorm": [],
    "key_rerotation": [],
    "simlayerkv": ["lazy_threshold=0.5", "n_recent=8"],
    "dms": ["sliding_window_size=8", "threshold=1.0"],
    "finch": ["window=8"],
}


@pytest.mark.parametrize("name", WRAPPERS)
def test_kvlens_compress_runs_each_wrapper(name, model_dirs, prompt_file, tmp_path, capsys):
    from kvcore.cli.main import main

    argv = [
        "compress",
        "--model",
        str(model_dirs["llama"]),
        "--prompt-file",
        str(prompt_file),
        "--tokens",
        "2",
    ]
    argv += ["--method", name, "--ratio", "0.25", "--positions", str(tmp_path / "kept.json"), "--json"]
    argv += [a for p in WRAPPERS[name] for a in ("--param", p)]
    assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "kept.json").exists()
