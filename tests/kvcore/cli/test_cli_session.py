"""kvlens compress|sweep --session FILE: the saved prefill instead of a new one, the same numbers, the saved model."""

import json
import shutil

import mlx.core as mx
import pytest

from kvcore.cache import files as cache_io
from kvcore.cli.main import main
from kvcore.engine.session import CompressionConfig, Session
from kvcore.engine.session_file import FORMAT, VERSION, model_fingerprint, save_session

PROMPT = (
    "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog.\n" * 2
)


@pytest.fixture(scope="module")
def saved(model_dirs, tmp_path_factory):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=6)
    path = tmp_path_factory.mktemp("cli") / "s.kvlens"
    save_session(path, s)
    return s, path


def test_compress_from_a_session_equals_the_session(saved, model_dirs, capsys, monkeypatch):
    s, path = saved
    prefills = []
    monkeypatch.setattr(Session, "prefill", lambda *a, **k: prefills.append(1))
    argv = ["compress", "--session", str(path), "--method", "snapkv", "--ratio", "0.5", "--json"]
    assert main(argv) == 0  # the default --model: the session's own model is loaded
    summary = json.loads(capsys.readouterr().out)
    regen = s.regenerate(s.compress(CompressionConfig("snapkv", 0.5)))
    assert summary["kl_mean"] == pytest.approx(regen.metrics["kl_mean"], rel=1e-6, abs=1e-9)
    assert summary["agreement"] == regen.metrics["agreement"]
    assert prefills == []


def test_sweep_from_a_session_runs_without_a_prefill(saved, capsys, monkeypatch, tmp_path):
    _, path = saved
    monkeypatch.setattr(Session, "prefill", lambda *a, **k: pytest.fail("a prefill ran"))
    out = tmp_path / "sweep.csv"
    argv = ["sweep", "--session", str(path), "--methods", "snapkv,knorm", "--ratios", "0.5", "--bits", "16"]
    assert main([*argv, "--csv", str(out)]) == 0
    rows = out.read_text().strip().splitlines()[1:]
    assert len(rows) == 2 * 4 * 2  # methods x layers x kv-heads
    assert {r.split(",")[0] for r in rows} == {"snapkv", "knorm"}


def test_a_session_of_another_model_exits_2_with_both_fingerprints(saved, model_dirs, capsys):
    _, path = saved
    argv = ["compress", "--session", str(path), "--model", str(model_dirs["qwen3"])]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "model:" in err
    assert (
        model_fingerprint(model_dirs["llama"])[:16] in err
        and model_fingerprint(model_dirs["qwen3"])[:16] in err
    )


def test_session_and_prompt_are_exclusive(saved, capsys):
    _, path = saved
    with pytest.raises(SystemExit) as exc:
        main(["compress", "--session", str(path), "--prompt", "x"])
    assert exc.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("spec", ["someorg/somemodel", "other"])
def test_the_model_a_session_names_is_checked_before_any_load(
    saved, model_dirs, capsys, monkeypatch, tmp_path, spec
):
    """Issue 42 item 6: a hub id in a session file started a download; a folder holding another model was loaded
    and only then refused. Now both exit 2 with one line before Session.load runs."""
    _, path = saved
    if spec == "other":  # the folder now holds another model (garbage weights: a load would fail otherwise)
        spec = str(tmp_path / "other")
        shutil.copytree(model_dirs["qwen3"], spec)
        (tmp_path / "other" / "model.safetensors").write_bytes(b"not weights")
    header, arrays = cache_io.read_file(path, FORMAT, VERSION)
    header["model"] = {**header["model"], "spec": spec}
    header["sha256"] = cache_io._digest(header, arrays)  # re-sealed with kvcore's own seal
    forged = tmp_path / "forged.kvlens"
    with open(forged, "wb") as fh:
        mx.save_safetensors(fh, dict(arrays), {"kvlens": json.dumps(header, sort_keys=True)})
    monkeypatch.setattr(Session, "load", lambda *a, **k: pytest.fail("a model load ran"))
    assert main(["compress", "--session", str(forged)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(forged) in err
    assert ("now holds another model" if spec.startswith("/") else "never downloads") in err


def test_a_session_measures_over_its_saved_continuation_and_refuses_another_length(saved, capsys):
    s, path = saved
    argv = ["compress", "--session", str(path), "--method", "snapkv", "--ratio", "0.5", "--json"]
    policy = ["--decode-method", "snapkv", "--decode-budget", "16", "--decode-interval", "4"]
    assert main([*argv, *policy]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert len(s.tokenizer.encode(summary["decode_text"])) <= len(s.dense_tokens), (
        "the decode runs the saved length"
    )
    assert main([*argv, "--tokens", str(len(s.dense_tokens) + 30)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"saved continuation has {len(s.dense_tokens)} tokens" in err and "drop --tokens" in err
    assert len(err.splitlines()) == 1
    assert main([*argv, "--tokens", str(len(s.dense_tokens))]) == 0
