"""entropy_gated_chunkkv, lukv and kvcompose against NumPy readings of kvpress 0.5.5's definitions, on a tiny real
model's prefill (inner scores recomputed here from the cached keys: knorm)."""

from __future__ import annotations

import math

import mlx.core as mx
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


def knorm(obs) -> np.ndarray:
    return -np.linalg.norm(np.array(obs.keys).astype(np.float64), axis=-1)


def kept(observations, name: str, ratio: float, **params):
    return selection.select(selection.rank(observations, methods.get(name, **params)), ratio)


def entropy_gated_reference(scores: np.ndarray, chunk: int, low: int, ratio: float) -> list[int]:
    """kvpress's greedy pass, read from its docstring and loop: a chunk at or above the (lower) median mean with
    entropy below the (lower) median entropy keeps its top `low`; the rest whole; leftovers by score."""
    n_tokens = scores.size
    bounds = [(s, min(s + chunk, n_tokens)) for s in range(0, n_tokens, chunk)]
    means, entropies = [], []
    for s, e in bounds:
        part = scores[s:e]
        means.append(part.mean())
        if e - s == 1:
            entropies.append(0.0)
            continue
        part = part - min(part.min(), 0.0)
        p = part / (part.sum() + 1e-8)
        entropies.append(min(max(-(p * np.log(p + 1e-8)).sum() / math.log(e - s), 0.0), 1.0))
    means, entropies = np.array(means), np.array(entropies)
    median_mean = sorted(means)[(len(means) - 1) // 2]
    median_entropy = sorted(entropies)[(len(entropies) - 1) // 2]
    budget, keep = n_kept(n_tokens, ratio), set()
    for c in sorted(range(len(bounds)), key=lambda c: -means[c]):
        if budget <= 0:
            break
        s, e = bounds[c]
        n = min(e - s, budget)
        if means[c] >= median_mean and entropies[c] < median_entropy:
            n = min(n, low)
        keep |= {s + int(i) for i in np.argsort(-scores[s:e])[:n]}
        budget -= n
    rest = [t for t in range(n_tokens) if t not in keep]
    keep |= {rest[int(i)] for i in np.argsort(-scores[rest])[:budget]}
    return sorted(keep)


def test_entropy_gated_chunkkv_trims_spiky_important_chunks(llama):
    _, observations = llama
    for ratio in RATIOS:
        got = kept(observations, "entropy_gated_chunkkv-knorm", ratio, chunk_length=7)
        for obs, layer in zip(observations, got, strict=True):
            want = entropy_gated_reference(knorm(obs).sum(axis=0), 7, 4, ratio)
            assert layer.tolist() == want
            assert len(want) == n_kept(N_TOKENS, ratio)


def test_entropy_gated_chunkkv_trims_at_least_one_chunk(llama):
    """The gate matters on this prompt: the kept set is not chunkkv's whole chunks."""
    _, observations = llama
    gated = kept(observations, "entropy_gated_chunkkv-knorm", 0.25, chunk_length=10)
    whole = kept(observations, "chunkkv-knorm", 0.25, chunk_length=10)
    assert any(a.tolist() != b.tolist() for a, b in zip(gated, whole, strict=True))


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        (
            "entropy_gated_chunkkv",
            {"low_entropy_chunk_length": 10},
            "low_entropy_chunk_length 10 must be below chunk_length 10: lower it",
        ),
        ("entropy_gated_chunkkv", {"chunk_length": 91}, "chunk_length 91 is longer than the prompt"),
        ("entropy_gated_chunkkv-tova", {}, "needs a per-head scorer"),
        (
            "lukv-knorm",
            {"curve": (0.5, 0.5, 0.5)},
            r"curve has 3 values but this model needs 99·4·2 = 792 .a whole",
        ),
        ("lukv-knorm", {"curve": (1.5,)}, "takes curve up to 1"),
    ],
)
def test_bad_parameters_say_how_to_fix_them(llama, name, params, message):
    _, observations = llama
    with pytest.raises(ValueError, match=message):
        kept(observations, name, 0.25, **params)


CLI_METHODS = {
    "entropy_gated_chunkkv": [],
    "lukv": [],
    "lukv-snapkv": ["curve=0.5,0.6,0.7,0.8,0.5,0.6,0.7,0.8"],
}


@pytest.mark.parametrize("name", CLI_METHODS)
def test_kvlens_compress_runs_each_method(name, model_dirs, prompt_file, tmp_path, capsys):
    from kvcore.cli.main import main

    argv = ["compress", "--model", str(model_dirs["llama"]), "--prompt-file", str(prompt_file)]
    argv += ["--tokens", "2", "--method", name, "--ratio", "0.25"]
    argv += ["--positions", str(tmp_path / "kept.json"), "--json"]
    argv += [a for p in CLI_METHODS[name] for a in ("--param", p)]
    assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "kept.json").exists()


def knorm_ranked(observations) -> list[np.ndarray]:
    """knorm's scores as KV Lens ranks them (float32; layer 0's repeated tokens tie exactly there, as RoPE keeps
    norms, where float64 norms of the same keys differ in the 8th digit)."""
    return [layer.scores for layer in selection.rank(observations, "knorm").layers]


def lukv_reference(scores: np.ndarray, prune: np.ndarray, sink: int, window: int) -> list[list[int]]:
    """kvpress's LU-KV per layer: counts by largest remainder of (1 − prune)·T, sink and window above all."""
    n_heads, n_tokens = scores.shape
    ideal = (1 - prune) * n_tokens
    total = max(n_heads, min(n_heads * n_tokens, round(ideal.sum())))
    counts = [math.floor(x) for x in ideal]
    fractions = sorted(range(n_heads), key=lambda h: -(ideal[h] - counts[h]))
    for h in fractions[: max(0, total - sum(counts))]:
        counts[h] += 1
    scores = scores.copy()
    protected = [*range(sink), *range(n_tokens - window, n_tokens)]
    scores[:, protected] = scores.max() + 1
    return [
        sorted(np.argsort(-scores[h], kind="stable")[: min(max(counts[h], 1), n_tokens)].tolist())
        for h in range(n_heads)
    ]


def test_lukv_reads_each_heads_budget_from_the_curve(llama):
    _, observations = llama
    n_layers, n_heads = len(observations), observations[0].n_kv_heads
    slots = np.arange(n_layers * n_heads) / (n_layers * n_heads - 1)
    curve = np.minimum(0.99, np.arange(1, 100)[:, None] / 100 * (0.5 + slots[None]))
    for ratio in RATIOS:
        got = kept(observations, "lukv-knorm", ratio, curve=tuple(curve.ravel().tolist()))
        row = curve[round((1 - ratio) * 100) - 1].reshape(n_layers, n_heads)
        for layer, (scores, heads) in enumerate(zip(knorm_ranked(observations), got, strict=True)):
            want = lukv_reference(scores, row[layer].astype(np.float32), 4, 1)
            assert [h.tolist() for h in heads] == want
        counts = [len(h) for layer in got for h in layer]
        assert len(set(counts)) > 1  # the curve's budgets differ by head


def test_lukv_with_one_row_and_without_a_curve(llama):
    _, observations = llama
    n_layers, n_heads = len(observations), observations[0].n_kv_heads
    row = np.linspace(0.2, 0.8, n_layers * n_heads)
    got = kept(observations, "lukv-knorm", 0.5, curve=tuple(row.tolist()), sink=2, n_recent=3)
    for layer, (scores, heads) in enumerate(zip(knorm_ranked(observations), got, strict=True)):
        prune = row.reshape(n_layers, n_heads)[layer].astype(np.float32)
        assert [h.tolist() for h in heads] == lukv_reference(scores, prune, 2, 3)
    uniform = kept(observations, "lukv-knorm", 0.25)
    for scores, heads in zip(knorm_ranked(observations), uniform, strict=True):
        prune = np.full(n_heads, 0.75, np.float32)
        assert [h.tolist() for h in heads] == lukv_reference(scores, prune, 4, 1)


def test_expected_attention_epsilon_adds_epsilon_times_the_value_norm(llama):
    """kvpress's (scores + ε)·‖v‖₂, which lukv's default inner reads with ε = 0.02."""
    _, observations = llama
    plain = selection.rank(observations, "expected_attention").layers
    shifted = selection.rank(observations, methods.get("expected_attention", attention_epsilon=0.02)).layers
    for obs, a, b in zip(observations, plain, shifted, strict=True):
        norms = np.linalg.norm(np.array(obs.values).astype(np.float64), axis=-1)[:, 4:]
        np.testing.assert_allclose(b.scores[:, 4:] - a.scores[:, 4:], 0.02 * norms, rtol=1e-4, atol=1e-6)


def test_lukv_keeps_its_own_defaults_through_a_session_config():
    """KV Lens's `window` (observation window, 64) is bound by CompressionConfig: lukv's recent positions are
    `n_recent`, so a config keeps kvpress's default 1."""
    from kvcore.engine.session import CompressionConfig

    values = CompressionConfig("lukv", 0.25).method_instance.values()
    assert (values["sink"], values["n_recent"], values["curve"]) == (4, 1, ())


def test_kvcompose_context_attention_is_the_rereads_attention(loaded_models):
    """The re-read's attention equals a prefill of the context twice (causal): its last T queries over 2T keys."""
    from kvcore.methods.kvcompose import context_attention

    model, _ = loaded_models["llama"]
    n = 40
    ids = [int(t) for t in np.random.default_rng(7).integers(1, model.args.vocab_size, n)]
    twice = capture.prefill_with_capture(model, ids + ids, window=2 * n).observations
    for obs in twice:
        q = np.array(obs.window_queries[:, n:]).astype(np.float64)  # [H_q, N, D]
        k = np.array(obs.keys).astype(np.float64)  # [H_kv, 2N, D]
        k = np.repeat(k, obs.group, axis=0)
        logits = q @ k.transpose(0, 2, 1) * obs.scale
        visible = np.arange(2 * n)[None, :] <= (n + np.arange(n))[:, None]
        logits = np.where(visible, logits, -np.inf)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        for agg, want in (("max", probs[..., :n].max(axis=1)), ("mean", probs[..., :n].mean(axis=1))):
            got = np.array(context_attention(obs.window_queries[:, n:], obs.keys, n, obs.scale, agg))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("agg_task", [0, 1])
def test_kvcompose_rereads_a_long_context_in_steps_with_the_same_scores(loaded_models, monkeypatch, agg_task):
    """A context whose re-read would hold more than REREAD_SCORES attention scores per layer goes through the model
    in steps (at 8k tokens one pass held 2^32 and crashed the CPU backend); the steps give the one pass's scores."""
    from kvcore.methods import kvcompose

    model, _ = loaded_models["llama"]
    ids = [int(t) for t in np.random.default_rng(8).integers(1, model.args.vocab_size, 40)]
    method = methods.get("kvcompose", agg_task=agg_task)
    scores = []
    for limit in (
        kvcompose.REREAD_SCORES,
        7 * 2 * 40 * model.args.num_attention_heads,
    ):  # one step; steps of 7
        monkeypatch.setattr(kvcompose, "REREAD_SCORES", limit)
        captured = capture.prefill_with_capture(model, ids)
        assert method.reconstruct(model, None, captured, ids, False) == 1
        scores.append([np.array(o.reconstruction[method.reconstruction_key]) for o in captured.observations])
    for one_pass, stepped in zip(*scores, strict=True):
        np.testing.assert_allclose(stepped, one_pass, rtol=1e-5, atol=1e-7)


def kvcompose_reference(scores: list[np.ndarray], ratio: float, structured: bool, bound: int) -> list:
    """kvpress's composite budgets, step by step: sorted rows, lifted first tokens, a global top-n, bin counts."""
    n_layers, (n_heads, n_tokens) = len(scores), scores[0].shape
    rows = [[sorted(s[h].tolist(), reverse=True) for h in range(n_heads)] for s in scores]
    for layer in rows:
        for row in layer:
            for i in range(bound):
                row[i] += 1e9
    if structured:
        composite = [
            [sum(np.sort(s[h])[::-1][t] for h in range(n_heads)) / n_heads for t in range(n_tokens)]
            for s in scores
        ]
        composite = [[v + (1e9 if t < bound else 0) for t, v in enumerate(c)] for c in composite]
        composite[0] = [max(c[t] for c in composite) for t in range(n_tokens)]
        flat = [(v, layer) for layer, c in enumerate(composite) for v in c]
        n = n_kept(n_layers * n_tokens, ratio)
        counts = [0] * n_layers
        for _, layer in sorted(flat, key=lambda x: -x[0])[:n]:
            counts[layer] += 1
        return [[max(c, 1, bound)] * n_heads for c in counts]
    flat = [(v, layer, h) for layer in range(n_layers) for h in range(n_heads) for v in rows[layer][h]]
    n = n_kept(n_layers * n_heads * n_tokens, ratio)
    counts = [[0] * n_heads for _ in range(n_layers)]
    for _, layer, h in sorted(flat, key=lambda x: -x[0])[:n]:
        counts[layer][h] += 1
    return [[max(c, 1) for c in layer] for layer in counts]


@pytest.mark.parametrize(("structured", "bound"), [(1, 0), (0, 0), (1, 3)])
def test_kvcompose_budgets_are_global_composite_tokens(llama, structured, bound):
    import copy

    _, observations = llama
    method = methods.get("kvcompose", structured=structured, keep_token_lower_bound=bound)
    rng = np.random.default_rng(11)
    scores, fed = [], []
    for obs in observations:  # the re-read's scores as the reconstruction pass caches them
        s = rng.random((obs.n_kv_heads, N_TOKENS)).astype(np.float32) ** (1 + len(scores))
        scores.append(s)
        o = copy.copy(obs)
        o.reconstruction = {method.reconstruction_key: mx.array(s)}
        fed.append(o)
    for ratio in RATIOS:
        got = kept(fed, "kvcompose", ratio, structured=structured, keep_token_lower_bound=bound)
        counts = kvcompose_reference(scores, ratio, bool(structured), bound)
        for s, layer, want in zip(scores, got, counts, strict=True):
            assert [len(h) for h in layer] == want
            for h, positions in enumerate(layer):
                assert list(positions) == sorted(np.argsort(-s[h], kind="stable")[: want[h]].tolist())
        assert len({len(h) for layer in got for h in layer}) > 1  # the layers' budgets differ


def test_kvcompose_without_its_reread_names_the_fix(llama):
    _, observations = llama
    with pytest.raises(ValueError, match="re-reads the context"):
        kept(observations, "kvcompose", 0.25)


def chunk_mean_rows(scores: np.ndarray, chunk: int) -> np.ndarray:
    per_position = scores.astype(np.float64).sum(axis=0)
    means = [
        per_position[(t // chunk) * chunk : (t // chunk + 1) * chunk].mean() for t in range(per_position.size)
    ]
    return np.broadcast_to(np.array(means, np.float32), scores.shape)


@pytest.mark.parametrize("name", ["chunkkv-knorm", "entropy_gated_chunkkv-knorm"])
def test_final_scores_are_a_chunk_wrappers_chunk_means(llama, name):
    """The heatmap's Score view reads selection.final_scores: the chunk means a chunk wrapper ranks by."""
    _, observations = llama
    ranking = selection.rank(observations, methods.get(name, chunk_length=7))
    for layer, shown in zip(ranking.layers, selection.final_scores(ranking, 0.25), strict=True):
        np.testing.assert_allclose(shown, chunk_mean_rows(layer.scores, 7), rtol=1e-5, atol=1e-6)
    plain = selection.rank(observations, "knorm")
    for layer, shown in zip(plain.layers, selection.final_scores(plain, 0.25), strict=True):
        assert shown is layer.scores
