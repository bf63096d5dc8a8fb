"""Re-scoring decoding policies and h2o_online, checked against float64 NumPy replays of the same decode."""

import csv
import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from kvcore.cli.main import main
from kvcore.engine.decode_scoring import h2o_recent
from kvcore.engine.decoding import DECODE_METHODS, DecodingPolicy, decode_with_policy
from kvcore.engine.session import CompressionConfig, Session
from kvcore.engine.timeline import held_before
from kvcore.methods.budgets import n_kept
from kvcore.model import attention

PROMPT = "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog. "
N = 16


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=N)
    return s


@pytest.fixture(scope="module")
def full(session):
    return session.compress(CompressionConfig("full", 1.0))


def _layer0(session, tokens):
    """Layer 0's post-RoPE queries [H_q, P, D], keys [H_kv, P, D] (float64) and scale over prompt + `tokens`: they
    depend only on each token and its position, so a dense pass gives exactly what the decode scored."""
    q, k, _, scale = _layer0_qkv(session, tokens)
    return q, k, scale


def _layer0_qkv(session, tokens):
    """_layer0 with the values [H_kv, P, D] too (as fed: before any merge)."""
    cache = make_prompt_cache(session.model)
    seen = {}

    def observe(queries, keys, values, layer, scale, mask, latent=False):
        if layer is cache[0]:
            seen.update(q=queries[0], k=keys[0], v=values[0], scale=scale)

    with attention.observing(observe):
        session.model(mx.array([[*session.prompt_ids, *tokens]]), cache=cache)
    mx.eval(seen["q"], seen["k"], seen["v"])
    f64 = lambda a: np.array(a.astype(mx.float32)).astype(np.float64)  # noqa: E731
    return f64(seen["q"]), f64(seen["k"]), f64(seen["v"]), seen["scale"]


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("size", [{"budget": 9}, {"ratio": 0.2}])
def test_rows_never_exceed_target_plus_interval_for_every_policy(session, full, size):
    info, interval = session.info, 4
    row_bytes = 2 * info.head_dim * 4  # keys and values, float32 test weights
    for method in (m for m in DECODE_METHODS if m != "dms"):  # dms has no fixed size (test_dms_…)
        policy = DecodingPolicy(method, interval=interval, n_sink=2, **size)
        run = decode_with_policy(session, full, policy, N)
        assert len(run.tokens) == N and run.compressions, method
        for s in run.steps:
            target = policy.target(run.n_start + s.step - s.step % interval)
            if not method.startswith("adakv"):
                assert all(r <= target + interval for r in s.rows), method
                assert s.bytes == sum(s.rows) * info.n_kv_heads * row_bytes
        for c, before in held_before(run):
            target = policy.target(run.n_start + c.step)
            for heads, held in zip(c.kept, before, strict=True):
                # adakv spreads H_kv·target over the heads; the others keep target per head
                assert sum(map(len, heads)) == sum(min(target, len(p)) for p in held), method
                assert all(set(k) <= set(p) for k, p in zip(heads, held, strict=True))


def test_ratio_target_is_kvpress_count_of_positions_seen(session, full):
    policy = DecodingPolicy("snapkv", ratio=0.3, interval=4)
    run = decode_with_policy(session, full, policy, N)
    for c in run.compressions:
        assert {len(k) for heads in c.kept for k in heads} == {n_kept(run.n_start + c.step, 0.3)}


def test_snapkv_policy_keeps_what_numpy_keeps_on_the_same_recent_queries(session, full):
    policy = DecodingPolicy("snapkv", budget=10, interval=4)
    run = decode_with_policy(session, full, policy, N, keep_scores=True)
    q, k, scale = _layer0(session, run.tokens)
    group, kernel, last = q.shape[0] // k.shape[0], 5, 0
    assert [c.step for c in run.compressions] == list(range(0, N, 4))
    for c in run.compressions:
        # before decoding: the prompt's last queries (prefill captured them); then the tokens fed since the last check
        window = np.arange(run.n_start - min(64, run.n_start), run.n_start) if c.step == 0 else None
        if window is None:
            window = np.arange(run.n_start + last, run.n_start + c.step)[-64:]
        for h, held in enumerate(c.held[0]):
            held = np.array(held)
            assert np.array_equal(held[-len(window) :], window)  # the window's keys are the last rows
            logits = q[h * group : (h + 1) * group][:, window] @ k[h, held].T * scale
            probs = _softmax(np.where(held[None, None] <= window[None, :, None], logits, -np.inf))
            votes = probs[..., : len(held) - len(window)].mean(axis=1)
            padded = np.pad(votes, [(0, 0), (kernel // 2, kernel // 2)])
            pooled = sum(padded[:, i : i + votes.shape[1]] for i in range(kernel)) / kernel
            expected = np.concatenate([pooled.mean(axis=0), np.ones(len(window))])
            np.testing.assert_allclose(c.scores[0][h], expected, rtol=1e-4, atol=1e-6)
            rest = np.argsort(-expected[: len(held) - len(window)], kind="stable")
            ranked = np.concatenate([np.arange(len(held) - 1, len(held) - 1 - len(window), -1), rest])
            assert c.kept[0][h].tolist() == sorted(held[ranked[:10]].tolist())
        last = c.step


def test_h2o_online_scores_equal_a_float64_replay(session, full):
    policy = DecodingPolicy("h2o_online", budget=10, interval=3)
    run = decode_with_policy(session, full, policy, N, keep_scores=True)
    q, k, scale = _layer0(session, run.tokens)
    n_q, group, T = q.shape[0], q.shape[0] // k.shape[0], run.n_start
    # every prompt query over every prompt key (causal), then each fed token over the rows held when it was fed
    acc = np.zeros((n_q, q.shape[1]))
    for hq in range(n_q):
        logits = q[hq, :T] @ k[hq // group, :T].T * scale
        acc[hq, :T] = _softmax(np.where(np.tri(T, dtype=bool), logits, -np.inf)).sum(axis=0)
    held = [list(range(T))] * k.shape[0]
    last = 0
    for c in run.compressions:
        for h in range(k.shape[0]):
            held[h] = held[h] + list(range(T + last, T + c.step))
            assert c.held[0][h].tolist() == held[h]
            rows = np.array(held[h])
            for p in range(T + last, T + c.step):
                for hq in range(h * group, (h + 1) * group):
                    visible = rows[rows <= p]
                    acc[hq, visible] += _softmax(q[hq, p] @ k[h, visible].T * scale)
            score = acc[h * group : (h + 1) * group][:, rows].mean(axis=0)
            np.testing.assert_allclose(c.scores[0][h], score, rtol=1e-5, atol=1e-7)
            recent = h2o_recent(10)
            heavy = np.argsort(-score[:-recent], kind="stable")[: 10 - recent]
            assert c.kept[0][h].tolist() == sorted([*rows[heavy].tolist(), *rows[-recent:].tolist()])
            held[h] = c.kept[0][h].tolist()
        last = c.step
    assert last > 0


def test_dms_evicts_older_keys_below_the_threshold_and_keeps_the_window(session, full):
    probe = decode_with_policy(session, full, DecodingPolicy("knorm", budget=10**6), N)
    _, k, _ = _layer0(session, probe.tokens)
    norms = np.linalg.norm(k, axis=-1)  # [H_kv, positions]
    threshold = -float(np.median(norms))
    run = decode_with_policy(
        session, full, DecodingPolicy("dms", budget=6, interval=4, threshold=threshold), N
    )
    _, k, _ = _layer0(session, run.tokens)
    norms = np.linalg.norm(k, axis=-1)
    evicted_some = False
    for c, before in held_before(run):
        for h, (kept, held) in enumerate(zip(c.kept[0], before[0], strict=True)):
            kept, held = kept.tolist(), held.tolist()
            window, older = held[-6:], np.array(held[:-6], dtype=int)
            expected = [p for p in older.tolist() if -norms[h, p] >= threshold + 1e-4]
            assert set(window) <= set(kept) and set(expected) <= set(kept)
            assert all(-norms[h, p] < threshold + 1e-4 for p in set(held) - set(kept))
            evicted_some |= len(kept) < len(held)
    assert evicted_some


def test_teacher_forcing_feeds_the_given_tokens(session, full):
    rows = []
    forced = [session.dense_tokens[0], *reversed(session.dense_tokens[1:])]  # not what the model would pick
    policy = DecodingPolicy("knorm", budget=10**6)
    run = decode_with_policy(session, full, policy, N, forced=forced, on_logits=rows.append)
    assert len(rows) == N - 1 and [int(mx.argmax(r).item()) for r in rows] == run.tokens[1:]
    cache = make_prompt_cache(session.model)
    dense = session.model(mx.array([[*session.prompt_ids, *forced[: N - 1]]]), cache=cache)[0]
    T = len(session.prompt_ids)
    np.testing.assert_allclose(np.array(mx.stack(rows)), np.array(dense[T:]), rtol=1e-4, atol=1e-4)


def test_ctrl_c_keeps_what_was_generated(session, full):
    def interrupt(done, total):
        if done == 5:
            raise KeyboardInterrupt

    run = decode_with_policy(
        session, full, DecodingPolicy("tova", budget=8, interval=2), N, on_progress=interrupt
    )
    assert run.interrupted and len(run.tokens) == 5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "snapkv"}, "budget .* or a ratio"),
        ({"method": "snapkv", "budget": 8, "ratio": 0.5}, "budget .* or a ratio"),
        ({"method": "dms", "budget": 8}, "threshold goes with dms"),
        ({"method": "knorm", "budget": 8, "threshold": -1.0}, "threshold goes with dms"),
        ({"method": "dms", "ratio": 0.5, "threshold": -1.0}, "sliding window"),
    ],
)
def test_bad_policy_settings_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecodingPolicy(**kwargs)


def test_cli_prefill_then_decoding_with_a_timeline(model_dirs, prompt_file, tmp_path, capsys):
    timeline = tmp_path / "t.csv"
    argv = [
        "compress",
        "--model",
        str(model_dirs["llama"]),
        "--prompt-file",
        str(prompt_file),
        "--tokens",
        "9",
    ]
    argv += ["--method", "snapkv", "--ratio", "0.5", "--json", "--timeline", str(timeline)]
    argv += ["--decode-method", "h2o_online", "--decode-ratio", "0.3", "--decode-interval", "4"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "snapkv" and out["decode_method"] == "h2o_online" and out["decode_ratio"] == 0.3
    assert out["decode_tokens"] == 9 and not out["decode_interrupted"] and out["decode_compressions"] == 3
    with timeline.open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["step", "layer", "kv_head", "position", "kept"]
    state: dict[tuple, int] = {}  # (layer, kv_head, position) -> kept, replayed event by event in step order
    held_at: dict[int, set[int]] = {}
    events = sorted(
        (int(r["step"]), int(r["layer"]), int(r["kv_head"]), int(r["position"]), int(r["kept"])) for r in rows
    )
    for step in (0, 4, 8):
        for s, layer, head, pos, kept in events:
            if s <= step:
                state[layer, head, pos] = kept
        per_head: dict[tuple, int] = {}
        for (layer, head, _), kept in state.items():
            per_head[layer, head] = per_head.get((layer, head), 0) + kept
        held_at[step] = set(per_head.values())
    counts = [held_at[step] for step in (0, 4, 8)]
    assert {s for s, *_ in events if s > 0} <= set(range(1, 10))
    assert all(
        len(c) == 1 for c in counts
    )  # every head keeps the step's target, which grows with the positions
    first, middle, end = (c.pop() for c in counts)
    assert first < middle < end


def test_cli_timeline_needs_a_decoding_policy(tmp_path, prompt_file, capsys):
    argv = ["compress", "--model", str(tmp_path / "no-model"), "--prompt-file", str(prompt_file)]
    assert main([*argv, "--timeline", str(tmp_path / "t.csv")]) == 2
    assert "--timeline needs --decode-method" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main([*argv, "--decode-method", "snapkv", "--decode-budget", "4", "--decode-ratio", "0.5"])
    assert "--decode-ratio: not allowed with argument --decode-budget" in capsys.readouterr().err


def test_cam_merges_evicted_values_as_a_float64_replay(session, full):
    budget, n_sink, interval, merge_budget = 9, 2, 3, 3
    policy = DecodingPolicy("cam", budget=budget, interval=interval, n_sink=n_sink, merge_budget=merge_budget)
    run = decode_with_policy(session, full, policy, N, keep_cache=True)
    q, k, v, scale = _layer0_qkv(session, run.tokens)
    n_kv, group, T = k.shape[0], q.shape[0] // k.shape[0], run.n_start
    held = [list(range(T)) for _ in range(n_kv)]
    values = [{p: v[h, p] for p in range(q.shape[1])} for h in range(n_kv)]
    sums = [
        dict.fromkeys(range(q.shape[1]), 0.0) for _ in range(n_kv)
    ]  # decode-time attention, mean over group
    last, merged = 0, 0
    for c in run.compressions:
        for h in range(n_kv):
            held[h] = held[h] + list(range(T + last, T + c.step))
            rows = np.array(held[h])
            for p in range(T + last, T + c.step):  # each fed token over the rows held when it was fed
                visible = rows[rows <= p]
                for hq in range(h * group, (h + 1) * group):
                    probs = _softmax(q[hq, p] @ k[h, visible].T * scale) / group
                    for pos, a in zip(visible, probs, strict=True):
                        sums[h][pos] += a
            keep = sorted({*rows[rows < n_sink].tolist(), *rows[-(budget - n_sink) :].tolist()})
            assert c.kept[0][h].tolist() == keep
            evicted = [p for p in held[h] if p not in keep][-(c.step - last) :] if c.step > last else []
            before = {p: values[h][p].copy() for p in held[h]}
            pairs, weights = [], []
            for e in evicted:
                targets = [p for p in keep if p > e][:merge_budget]
                mean = np.mean([sums[h][t] for t in targets])
                prob = 0.0 if mean == 0 else min(1.0, max(0.0, sums[h][e] / mean))
                for t in targets:
                    values[h][t] = values[h][t] + prob * before[e] / len(targets)
                    pairs.append((e, t))
                    weights.append(prob / len(targets))
            merge = c.merges[0][h]
            assert merge.pairs.tolist() == [list(p) for p in pairs]
            np.testing.assert_allclose(merge.weight, weights, rtol=1e-5, atol=1e-7)
            merged += sum(w > 0 for w in weights)
            held[h] = keep
        last = c.step
    assert merged > 0
    layer = run.cache[0]
    stored = np.array(layer.keys_and_values()[1][0].astype(mx.float32))
    for h, pos in enumerate(layer.retained_positions):
        expected = np.stack([values[h][p] for p in pos.tolist()])
        np.testing.assert_allclose(stored[h, : len(pos)], expected, rtol=1e-4, atol=1e-5)


def test_rkv_policy_scores_importance_minus_redundancy_as_numpy(session, full):
    window, kernel, lam, threshold = 3, 7, 0.07, 0.5
    policy = DecodingPolicy("rkv", budget=10, interval=4, window=window)
    run = decode_with_policy(session, full, policy, N, keep_scores=True)
    q, k, scale = _layer0(session, run.tokens)
    group, last = q.shape[0] // k.shape[0], 0
    checked = 0
    for c in run.compressions:
        if c.step == 0:  # before decoding the window is the prompt's last queries (as snapkv's test checks)
            last = c.step
            continue
        win = np.arange(run.n_start + last, run.n_start + c.step)[-window:]
        for h, held in enumerate(c.held[0]):
            held = np.array(held)
            n_before = len(held) - len(win)
            logits = q[h * group : (h + 1) * group][:, win] @ k[h, held].T * scale
            probs = _softmax(np.where(held[None, None] <= win[None, :, None], logits, -np.inf))
            votes = probs[..., :n_before].mean(axis=1).mean(axis=0)
            padded = np.pad(votes, kernel // 2, constant_values=-np.inf)
            importance = np.max([padded[i : i + n_before] for i in range(kernel)], axis=0)
            unit = k[h, held] / (np.linalg.norm(k[h, held], axis=-1, keepdims=True) + 1e-8)
            sim = unit @ unit.T
            np.fill_diagonal(sim, 0.0)
            cols = np.arange(len(held))
            last_similar = np.where(sim > threshold, cols[None], 0).max(axis=-1)
            sim[cols, last_similar] = 0.0
            redundancy = _softmax(sim.mean(axis=-1))[:n_before]
            score = lam * importance - (1 - lam) * redundancy
            np.testing.assert_allclose(c.scores[0][h][:n_before], score, rtol=1e-4, atol=1e-6)
            ranked = np.concatenate(
                [np.arange(len(held) - 1, n_before - 1, -1), np.argsort(-score, kind="stable")]
            )
            assert c.kept[0][h].tolist() == sorted(held[ranked[:10]].tolist())
            checked += 1
        last = c.step
    assert checked


def test_expected_attention_policy_takes_its_statistics_from_the_recent_queries(session, full):
    from kvcore.capture.query_stats import Taps, future_rotation, tapped

    policy = DecodingPolicy("expected_attention", budget=10, interval=4)
    run = decode_with_policy(session, full, policy, N, keep_scores=True)
    cache, taps, seen = make_prompt_cache(session.model), Taps(), {}

    def observe(queries, keys, values, layer, scale, mask, latent=False):
        found = taps.pre_rope(queries)
        if layer is cache[0]:
            seen.update(pre=found[0][0], rope=found[1], k=keys[0], v=values[0])

    with tapped(session.model, taps), attention.observing(observe):
        session.model(mx.array([[*session.prompt_ids, *run.tokens]]), cache=cache)
    f64 = lambda a: np.array(a.astype(mx.float32)).astype(np.float64)  # noqa: E731
    pre, k, v = f64(seen["pre"]), f64(seen["k"]), f64(seen["v"])
    group, head_dim, n_sink, last, checked = pre.shape[0] // k.shape[0], k.shape[-1], 4, 0, 0
    for c in run.compressions:
        if c.step:
            window = np.arange(run.n_start + last, run.n_start + c.step)
            rot = f64(future_rotation(seen["rope"], head_dim, int(window[-1]) + 1))
            for h, held in enumerate(c.held[0]):
                held = np.array(held)
                keys = k[h, held[n_sink:]]
                probs = []
                for hq in range(h * group, (h + 1) * group):
                    q = pre[hq, window]
                    mean, cov = rot @ q.mean(axis=0), rot @ np.cov(q.T, bias=True) @ rot.T
                    logits = keys @ mean / np.sqrt(head_dim) + ((keys @ cov) * keys).sum(-1) / (2 * head_dim)
                    probs.append(_softmax(logits))
                score = np.mean(probs, axis=0) * np.linalg.norm(v[h, held[n_sink:]], axis=-1)
                np.testing.assert_allclose(c.scores[0][h][n_sink:], score, rtol=1e-4, atol=1e-6)
                checked += 1
        last = c.step
    assert checked


def test_expected_attention_policy_without_a_rope_module_is_refused_in_one_line():
    from kvcore.engine.decode_scoring import Rescorer

    with pytest.raises(ValueError, match="rope module"):
        Rescorer("expected_attention", prompt=[])._window_stats(0, mx.zeros((2, 1, 4)), 5)


def test_decoding_sweep_reuses_the_one_dense_continuation(session):
    from kvcore.engine.sweep import decode_grid, run_decode_sweep

    configs = [CompressionConfig("full", 1.0), CompressionConfig("snapkv", 0.5)]
    policies = decode_grid(["streaming_llm", "cam"], [9, 12], interval=4, n_sink=2)
    dense, calls = session.dense_tokens, session.forward_calls
    points = list(run_decode_sweep(session, configs, policies, N))
    assert len(points) == 4 * 2 and session.dense_tokens is dense
    # every forward pass of the sweep is a decode step of some point: nothing dense was decoded again
    each = {}
    for cfg in configs:
        state = session.compress(cfg)
        for p in policies:
            before = session.forward_calls
            run = decode_with_policy(session, state, p, N)
            each[cfg.method, p.method, p.budget] = (session.forward_calls - before, run.tokens)
    steps = 0
    for point in points:
        forward, tokens = each[point.config.method, point.policy.method, point.policy.budget]
        steps += forward
        same = sum(a == b for a, b in zip(dense, tokens, strict=False)) / N
        assert point.metrics["decode_agreement"] == same and point.metrics["decode_tokens"] == N
    assert steps == session.forward_calls - calls - steps


def test_cli_sweep_takes_decoding_axes(model_dirs, prompt_file, tmp_path, capsys):
    out = tmp_path / "d.csv"
    argv = ["sweep", "--model", str(model_dirs["llama"]), "--prompt-file", str(prompt_file), "--tokens", "8"]
    argv += ["--methods", "snapkv", "--ratios", "0.5", "--bits", "16", "--csv", str(out), "--n-sink", "2"]
    argv += ["--decode-methods", "streaming_llm,rkv", "--decode-budgets", "8,12", "--decode-interval", "4"]
    assert main(argv) == 0
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["decode_method"], r["decode_budget"]) for r in rows] == [
        ("streaming_llm", "8"),
        ("streaming_llm", "12"),
        ("rkv", "8"),
        ("rkv", "12"),
    ]
    assert all(
        r["method"] == "snapkv" and int(r["max_cache_tokens"]) <= int(r["decode_budget"]) + 4 for r in rows
    )
    assert main([*argv[:-4], "--decode-methods", "snapkv"]) == 2
    assert "--decode-budgets go together" in capsys.readouterr().err


def _rows_layer(keys):
    """A plain layer holding `keys` [H_kv, T, D] (values alike): what float_rows and head_rows read."""
    from types import SimpleNamespace

    k = mx.array(keys[None].astype(np.float32))
    return SimpleNamespace(keys=k, values=k, offset=keys.shape[1])


def _snapkv_numpy(q, k, window, kernel=5):
    """kvpress's snapkv over rows in the order given: [H_q, w, D] queries, [T, D] keys of one kv-head; the window
    (last w rows) scores +inf."""
    logits = q @ k.T
    n = k.shape[0]
    visible = np.arange(n)[None, :] <= np.arange(n - window, n)[:, None]
    votes = _softmax(np.where(visible[None], logits, -np.inf))[..., : n - window].mean(axis=1)
    padded = np.pad(votes, [(0, 0), (kernel // 2, kernel // 2)])
    pooled = sum(padded[:, i : i + n - window] for i in range(kernel)) / kernel
    return np.concatenate([pooled.mean(axis=0), np.full(window, np.inf)])


def test_kvpress_form_pools_along_the_order_kvpress_gathers_rows_in():
    """kvpress's DecodingPress keeps rows in torch.topk order (its tied window rows in torch's CPU order), and the
    next compression's snapkv pooling runs along that stored order: the kvpress form replays both."""
    from kvcore.engine.decode_scoring import Rescorer
    from kvcore.engine.torch_topk import torch_cpu_topk

    rng = np.random.default_rng(16)
    window, target, d = 3, 8, 4
    rescorer = Rescorer("snapkv", [], window=window, rope_of=lambda i: lambda x, offset=0: x)
    keys = rng.normal(size=(1, 12, d)) * 2
    queries = rng.normal(size=(2, window, d)) * 2
    positions = np.arange(12)
    rows = rescorer.keep_rows(0, _rows_layer(keys), [positions], mx.array(queries, mx.float32), target, 1.0)
    first = torch_cpu_topk(_snapkv_numpy(queries, keys[0], window).astype(np.float32), target)
    assert rescorer.kvpress_order[0, 0].tolist() == positions[first].tolist()
    assert rows[0].tolist() == sorted(first.tolist())
    assert first[:window].tolist() == [11, 9, 10]  # torch's order of the tied window rows

    # 4 tokens later: KV Lens stores the kept rows by position, kvpress in its gather's order
    held = np.concatenate([np.sort(positions[first]), np.arange(12, 16)])
    stored = np.concatenate([keys[0][np.sort(first)], rng.normal(size=(4, d)) * 2])
    queries = rng.normal(size=(2, window, d)) * 2
    rows = rescorer.keep_rows(
        0, _rows_layer(stored[None]), [held], mx.array(queries, mx.float32), target, 1.0
    )
    kvpress_rows = np.searchsorted(held, np.concatenate([positions[first], np.arange(12, 16)]))
    expected = _snapkv_numpy(queries, stored[kvpress_rows], window)
    by_position = _snapkv_numpy(queries, stored, window)
    finite = np.isfinite(expected)
    np.testing.assert_allclose(rescorer.last_scores[0][kvpress_rows][finite], expected[finite], rtol=1e-5)
    assert not np.allclose(np.sort(by_position[finite]), np.sort(expected[finite]))  # the order matters
    order = kvpress_rows[torch_cpu_topk(expected.astype(np.float32), target)]
    assert rescorer.kvpress_order[0, 0].tolist() == held[order].tolist()
    assert rows[0].tolist() == sorted(order.tolist())


def test_kvpress_form_scores_shared_rows_in_their_stored_order():
    """tova (every kv-head holds the same rows) in the kvpress form: the scores land on the right positions when
    kvpress's row order is not the position order (its shared path once scored the first rows unpermuted)."""
    from kvcore.engine.decode_scoring import Rescorer

    rng = np.random.default_rng(5)
    d, target = 4, 6
    rescorer = Rescorer("tova", [], rope_of=lambda i: lambda x, offset=0: x)
    positions = [np.arange(10)] * 2
    keys = rng.normal(size=(2, 10, d)) * 2
    last = rng.normal(size=(4, 1, d)) * 2
    rescorer.keep_rows(0, _rows_layer(keys), positions, mx.array(last, mx.float32), target, 1.0)
    order = rescorer.kvpress_order[0, 0]
    assert not np.array_equal(order, np.sort(order))
    held = np.concatenate([np.sort(order), [10, 11]])
    stored = np.concatenate([keys[:, np.sort(order)], rng.normal(size=(2, 2, d)) * 2], axis=1)
    last = rng.normal(size=(4, 1, d)) * 2
    rescorer.keep_rows(0, _rows_layer(stored), [held, held], mx.array(last, mx.float32), target, 1.0)
    probs = _softmax(last[:, 0][:, None] @ np.repeat(stored, 2, axis=0).transpose(0, 2, 1))[:, 0]
    np.testing.assert_allclose(rescorer.last_scores[0][:-1], probs.mean(axis=0)[:-1], rtol=1e-5)
