"""merging against a loop-by-loop NumPy reading of kvpress's MergingPress on a tiny real llama."""

import numpy as np
import pytest

from kvcore.engine.session import CompressionConfig, Session

PROMPT = "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=3, chat_template=False)
    return s


def reference(keys, values, kept, threshold=0.0):
    """Each evicted value into its most cosine-similar kept key's value, weights as kvpress; (values, targets)."""
    kept_values = values[kept].astype(np.float64)
    added, total = np.zeros_like(kept_values), np.zeros(len(kept))
    targets = {}
    for e in sorted(set(range(len(keys))) - set(kept.tolist())):
        sims = [keys[e] @ keys[k] / (np.linalg.norm(keys[e]) * np.linalg.norm(keys[k])) for k in kept]
        t = int(np.argmax(sims))
        if sims[t] < threshold:
            continue
        ev, tg = np.linalg.norm(values[e]), np.linalg.norm(kept_values[t])
        w = max(sims[t], 0.0) * ev / (ev + tg + 1e-6)
        added[t] += w * values[e]
        total[t] += w
        if w > 0:
            targets[e] = int(kept[t])
    merged = np.where(total[:, None] > 0, (kept_values + added) / (1 + total)[:, None], kept_values)
    return merged, targets


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_merging_folds_evicted_values_as_kvpress(session, threshold):
    params = {"similarity_threshold": threshold}
    state = session.compress(CompressionConfig("merging", 0.5, params=params))
    plain = session.compress(CompressionConfig("snapkv", 0.5))
    np.testing.assert_array_equal(state.kept, plain.kept)
    targets = Session.merge_targets(state)
    for i, obs in enumerate(session._observed("paper").observations):
        keys, values = np.array(obs.keys, np.float64), np.array(obs.values, np.float64)
        _, stored = state.cache[i].keys_and_values()
        for h, kept in enumerate(state.cache[i].retained_positions):
            want, want_targets = reference(keys[h], values[h], np.asarray(kept))
            if threshold:
                want, want_targets = reference(keys[h], values[h], np.asarray(kept), threshold)
            np.testing.assert_allclose(np.array(stored[0, h]), want, rtol=1e-4, atol=1e-5)
            got = {p: int(t) for p, t in enumerate(targets[i][h]) if t >= 0}
            assert got == want_targets
    assert state.bytes_compressed == plain.bytes_compressed
    assert any((t >= 0).any() for t in targets)


def test_merging_decodes_and_refuses_packed_values(session):
    assert len(session.regenerate(session.compress(CompressionConfig("merging-knorm", 0.5)), n=3).tokens) == 3
    with pytest.raises(ValueError, match="quantization off"):
        session.compress(CompressionConfig("merging", 0.5, bits=4, group_size=32))


@pytest.mark.parametrize(("method", "field"), [("think", "key_channels"), ("merging", "merged_into")])
def test_positions_file_shows_what_was_stored(model_dirs, tmp_path, capsys, method, field):
    import json

    from kvcore.cli.main import main

    out = tmp_path / "kept.json"
    argv = ["compress", "--model", str(model_dirs["llama"]), "-p", PROMPT, "--tokens", "1", "--json"]
    assert main([*argv, "--method", method, "--ratio", "0.5", "--positions", str(out)]) == 0
    capsys.readouterr()
    layers = json.loads(out.read_text())["layers"]
    assert all(field in layer and len(layer[field]) == len(layer["heads"]) for layer in layers)
