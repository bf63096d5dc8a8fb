"""Session files: save, open on a fresh Session over the same model, and everything compresses with no forward
pass; another model is refused with both fingerprints; tampered or truncated files are refused naming the part."""

import json

import mlx.core as mx
import numpy as np
import pytest

from kvcore.cache import files as cache_io
from kvcore.engine.session import CompressionConfig, Session
from kvcore.engine.session_file import (
    FORMAT,
    VERSION,
    model_fingerprint,
    model_folder,
    open_session,
    read_model,
    save_session,
)

PROMPT = "def area(w, h):\n    return w * h\nprint(area(3, 4))\n" * 3
CONFIGS = [
    CompressionConfig("snapkv", 0.5),
    CompressionConfig("h2o", 0.3, bits=4, group_size=32),
    CompressionConfig("tova", 0.4, schedule="mlx-lm"),
    CompressionConfig("pyramidkv", 0.5, per_head=True),
    CompressionConfig("expected_attention", 0.4),
    CompressionConfig("adakv-expected_attention", 0.3, schedule="mlx-lm"),
    CompressionConfig(
        "criticalkv-snapkv", 0.5, per_head=True
    ),  # reads each layer's o_proj, as after a prefill
]


@pytest.fixture(scope="module")
def saved(model_dirs, tmp_path_factory):
    """(original session, path of its session file)."""
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=6)
    path = tmp_path_factory.mktemp("sessions") / "demo.kvlens"
    save_session(path, s, {"config": CONFIGS[0].to_dict(), "note": "é"}, {"kept": np.eye(3, dtype=bool)})
    return s, path


def _fresh(original: Session) -> Session:
    return Session(original.model, original.tokenizer, original.info)


def test_open_restores_everything_without_a_forward_pass(saved):
    original, path = saved
    s = _fresh(original)
    extra, arrays = open_session(path, s)
    assert extra == {"config": CONFIGS[0].to_dict(), "note": "é"}
    np.testing.assert_array_equal(arrays["kept"], np.eye(3, dtype=bool))
    assert s.prompt_ids == original.prompt_ids and s.dense_tokens == original.dense_tokens
    assert s.chat_template_applied == original.chat_template_applied
    for cfg in CONFIGS:
        a, b = original.compress(cfg), s.compress(cfg)
        np.testing.assert_array_equal(a.kept, b.kept)
        assert a.stats_rows == b.stats_rows and a.bytes_compressed == b.bytes_compressed
    assert s.forward_calls == 0  # opening and compressing every method: no forward pass
    for cfg in CONFIGS[:2]:
        ra, rb = original.regenerate(original.compress(cfg)), s.regenerate(s.compress(cfg))
        assert ra.tokens == rb.tokens and ra.metrics["kl_per_step"] == rb.metrics["kl_per_step"]
    assert original.extend(2) == s.extend(2)  # the restored decode cache continues identically


def test_a_session_from_another_model_is_refused_with_both_fingerprints(saved, model_dirs):
    _, path = saved
    other = Session.load(str(model_dirs["qwen3"]))
    with pytest.raises(ValueError) as err:
        open_session(path, other)
    message = str(err.value)
    assert "model:" in message and "\n" not in message
    assert model_fingerprint(model_dirs["llama"])[:16] in message
    assert model_fingerprint(model_dirs["qwen3"])[:16] in message
    assert other.prompt_ids == [] and other.forward_calls == 0


def _forged(path, tmp_path, edit_header=None, edit_arrays=None):
    """A copy of the file with the edits and a recomputed digest (the digest alone cannot catch these)."""
    header, arrays = cache_io.read_file(path, FORMAT, VERSION)
    arrays = dict(arrays)
    if edit_header:
        edit_header(header)
    if edit_arrays:
        edit_arrays(arrays)
    out = tmp_path / "forged.kvlens"
    header["sha256"] = cache_io._digest(header, arrays)
    with open(out, "wb") as fh:  # a file object: given a path, mlx would append ".safetensors"
        mx.save_safetensors(fh, arrays, {"kvlens": json.dumps(header, sort_keys=True)})
    return out


def _swap(a, b):
    def edit(arrays):
        arrays[a], arrays[b] = arrays[b], arrays[a]

    return edit


TAMPER = {
    "prompt id past the vocabulary": (lambda h: h["prompt_ids"].__setitem__(0, 10**9), None, "prompt_ids"),
    "dense token not an int": (lambda h: h["dense_tokens"].__setitem__(0, "x"), None, "dense_tokens"),
    "cache offset": (lambda h: h["cache_layers"][1].__setitem__("offset", -7), None, "cache_layers: layer 1"),
    "decode offset": (
        lambda h: h["decode_layers"][0].__setitem__("offset", 3),
        None,
        "decode_layers: layer 0",
    ),
    "observation scale": (
        lambda h: h["observations"]["paper"][2].__setitem__("scale", -1.0),
        None,
        r"observations \(paper\): layer 2 scale",
    ),
    "observation heads": (
        lambda h: h["observations"]["mlx-lm"][0].__setitem__("n_q_heads", 99),
        None,
        r"observations \(mlx-lm\): layer 0 heads",
    ),
    "h2o sums NaN": (
        None,
        lambda a: a.update({"obs.full.0.h2o_sums": a["obs.full.0.h2o_sums"] * np.nan}),
        r"observations \(paper\): obs.full.0.h2o_sums holds NaN",
    ),
    "reference logits cut": (
        None,
        lambda a: a.update({"reference.paper": a["reference.paper"][:2]}),
        "reference logits: reference.paper",
    ),
    "logits int": (None, lambda a: a.update({"logits.full": a["logits.full"].astype(mx.int32)}), "logits:"),
    "query statistics count": (
        lambda h: h["observations"]["paper"][1].__setitem__("query_count", 3),
        None,
        r"observations \(paper\): layer 1: query_count must be",
    ),
    "query rotation NaN": (
        None,
        lambda a: a.update({"obs.before.0.query_rotation": a["obs.before.0.query_rotation"] * np.nan}),
        r"observations \(mlx-lm\): layer 0: obs.before.0.query_rotation holds NaN",
    ),
    "skipped not an object": (lambda h: h.__setitem__("skipped", [1]), None, "skipped:"),
    "extra not an object": (lambda h: h.__setitem__("extra", "x"), None, "header:"),
    "swapped h2o sums": (
        None,
        _swap("obs.full.1.h2o_sums", "obs.before.1.h2o_sums"),
        r"observations \(paper\)",
    ),
    "swapped keys of two kinds": (None, _swap("cache.0.keys.0", "decode.0.keys.0"), "cache_layers: layer 0"),
    "wrong format": (lambda h: h.__setitem__("format", "kvlens-cache"), None, "format 'kvlens-cache'"),
}


@pytest.mark.parametrize("case", list(TAMPER))
def test_tampered_fields_are_refused_naming_the_part(saved, tmp_path, case):
    original, path = saved
    edit_header, edit_arrays, part = TAMPER[case]
    forged = _forged(path, tmp_path, edit_header, edit_arrays)
    s = _fresh(original)
    with pytest.raises(ValueError, match=f"{forged}: {part}") as err:
        open_session(forged, s)
    assert "\n" not in str(err.value)
    assert s.prompt_ids == [] and s._capture is None  # nothing half-restored


@pytest.mark.parametrize("keep", [0, 7, 200, 0.5, -1])
def test_truncated_or_damaged_files_are_refused(saved, tmp_path, keep):
    original, path = saved
    raw = path.read_bytes()
    cut = tmp_path / "cut.kvlens"
    n = int(len(raw) * keep) if isinstance(keep, float) else keep
    cut.write_bytes(raw[:n] if n >= 0 else raw[:-1])
    with pytest.raises(ValueError, match=f"{cut}: (truncated|not a safetensors)"):
        open_session(cut, _fresh(original))
    flipped = bytearray(raw)
    flipped[-9] ^= 0x40
    cut.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="SHA-256 digest mismatch"):
        open_session(cut, _fresh(original))


def test_nothing_to_save_before_a_prefill(model_dirs, tmp_path):
    s = Session.load(str(model_dirs["llama"]))
    with pytest.raises(ValueError, match="prefill a prompt first"):
        save_session(tmp_path / "x.kvlens", s)
    assert list(tmp_path.iterdir()) == []


def test_expected_attention_reopens_from_a_prompt_shorter_than_its_kept_queries(model_dirs, tmp_path):
    """T below the 64 queries kept one by one (no running mean yet): the reopened session scores the same."""
    s = Session.load(str(model_dirs["qwen3"]))
    s.prefill(PROMPT[:30], n_tokens=2)
    assert len(s.prompt_ids) < 64
    path = tmp_path / "short.kvlens"
    save_session(path, s)
    t = _fresh(s)
    open_session(path, t)
    for cfg in (CompressionConfig("expected_attention", 0.5, n_sink=2), CONFIGS[-1]):
        np.testing.assert_array_equal(s.compress(cfg).kept, t.compress(cfg).kept)
    assert t.forward_calls == 0


def test_a_file_without_query_statistics_opens_and_expected_attention_names_the_fix(saved, tmp_path):
    """Files saved before the statistics were: every other method works, expected_attention says what to do."""
    original, path = saved

    def drop(header):
        for layers in header["observations"].values():
            for layer in layers:
                layer.pop("query_count", None)

    def drop_arrays(arrays):
        for name in [n for n in arrays if ".query_" in n]:
            del arrays[name]

    s = _fresh(original)
    open_session(_forged(path, tmp_path, drop, drop_arrays), s)
    np.testing.assert_array_equal(s.compress(CONFIGS[0]).kept, original.compress(CONFIGS[0]).kept)
    with pytest.raises(ValueError, match="query_stats=True"):
        s.compress(CONFIGS[-2])


@pytest.mark.parametrize("side", ["cache.2.keys.0", "decode.0.values.0"])
def test_infinite_cache_entries_are_refused(saved, tmp_path, side):
    """Issue 42 item 4: an infinite key or value was accepted and gave NaN metrics."""
    original, path = saved

    def poison(arrays):
        x = np.array(arrays[side])
        x[0, 1, 2, 3] = -np.inf
        arrays[side] = mx.array(x)

    forged = _forged(path, tmp_path, edit_arrays=poison)
    s = _fresh(original)
    with pytest.raises(ValueError, match="hold NaN or infinite values") as err:
        open_session(forged, s)
    assert str(forged) in str(err.value) and s.prompt_ids == [] and s._capture is None


def test_model_folder_resolves_only_a_local_folder_whose_fingerprint_matches(saved, model_dirs, tmp_path):
    """Issue 42 item 6: the model a file names is checked before anything loads it; a hub id is never fetched."""
    _, path = saved
    assert model_folder(path) == str(model_dirs["llama"])
    for spec, fingerprint, fragment in (
        ("someorg/somemodel", "0" * 64, "not a model folder on this computer"),
        (str(tmp_path / "gone"), "0" * 64, "not a model folder on this computer"),
        (str(model_dirs["qwen3"]), model_fingerprint(model_dirs["llama"]), "now holds another model"),
    ):
        model = {"spec": spec, "name": "llama", "fingerprint": fingerprint}
        forged = _forged(path, tmp_path, edit_header=lambda h, m=model: h.__setitem__("model", m))
        with pytest.raises(ValueError, match=fragment) as err:
            model_folder(forged)
        assert str(forged) in str(err.value) and "\n" not in str(err.value)
        if "not a model folder" in fragment:
            assert "never downloads" in str(err.value)
    forged = _forged(path, tmp_path, edit_header=lambda h: h["model"].__setitem__("spec", ["x"]))
    with pytest.raises(ValueError, match="model: expected the model's spec"):
        read_model(forged)
