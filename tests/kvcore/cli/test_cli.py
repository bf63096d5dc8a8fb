"""kvlens compress / sweep: outputs that parse, and exit 2 with one line and no file on bad input."""

import csv
import json
import subprocess
import sys

import pytest

from kvcore.cli.main import SUMMARY_COLUMNS, main
from kvcore.measure.export import STATS_COLUMNS
from tests.kvcore.conftest import CLI_PROMPT as PROMPT
from tests.model_factory import build_model


def test_compress_writes_csv_positions_and_json(model_dirs, prompt_file, tmp_path, capsys):
    csv_path, pos_path = tmp_path / "stats.csv", tmp_path / "kept.json"
    argv = ["compress", "--model", str(model_dirs["llama"]), "--prompt-file", str(prompt_file)]
    argv += ["--method", "h2o", "--ratio", "0.25", "--bits", "4", "--group-size", "32", "--tokens", "6"]
    argv += ["--csv", str(csv_path), "--positions", str(pos_path), "--json", "--schedule", "mlx-lm"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == "h2o" and summary["key_bits"] == 4
    assert 0 < summary["compression_ratio"] < 0.25
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(STATS_COLUMNS)
    assert len(rows) == 4 * 2
    assert sum(int(r["bytes_compressed"]) for r in rows) == summary["bytes_compressed_total"]
    kept = json.loads(pos_path.read_text())
    T = len(kept["prompt_tokens"]) - 1
    n = max(1, int(T * 0.25))  # kvpress's budget
    assert len(kept["layers"]) == 4
    for layer in kept["layers"]:
        assert len(layer["heads"]) == 2
        for heads in layer["heads"]:
            assert len(heads) == n and heads == sorted(heads) and max(heads) < T
    assert [int(r["tokens_kept"]) for r in rows] == [n] * 8


def test_sweep_one_prefill_every_combination(model_dirs, prompt_file, tmp_path, capsys):
    out = tmp_path / "sweep.csv"
    argv = ["sweep", "--model", str(model_dirs["qwen3"]), "--prompt-file", str(prompt_file), "--tokens", "4"]
    argv += ["--methods", "snapkv,knorm", "--ratios", "0.25:0.5:0.25", "--bits", "4,16", "--csv", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "8/8" in err
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(STATS_COLUMNS) + list(SUMMARY_COLUMNS)
    combos = {(r["method"], r["retention_ratio"], r["key_bits"]) for r in rows}
    assert len(combos) == 8 and len(rows) == 8 * 3 * 2
    ratio = {(r["method"], r["retention_ratio"], r["key_bits"]): float(r["compression_ratio"]) for r in rows}
    for method, retention, bits in combos:
        if bits == "4":  # packing at 4 bits stores fewer bytes than the same selection unquantized
            assert ratio[method, retention, "4"] < ratio[method, retention, "16"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--plot", "f.png"], "draws with Qt"),
        (["--plot", "f.txt"], "write a .png or .svg"),
        (["--ratios", "0.5:0.1:0.1"], "--ratios"),
    ],
)
def test_bad_sweep_options_exit_2_before_any_work(tmp_path, prompt_file, capsys, extra, message):
    argv = ["sweep", "--model", str(tmp_path / "no-such-model"), "--prompt-file", str(prompt_file)]
    assert main([*argv, *[str(tmp_path / a) if a.startswith("f.") else a for a in extra]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlens: error:") and message in err and "\n" not in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "nope"], "unknown method"),
        (["--ratio", "0"], "ratio must be in"),
        (["--ratio", "1.5"], "ratio must be in"),
        (["--bits", "7"], "--bits/--key-bits 7"),
        (["--bits", "4", "--group-size", "48"], "group size must be one of"),
        (["--bits", "4", "--group-size", "64"], "does not divide head_dim 32"),
        (["--tokens", "5000"], "context is 4096"),
    ],
)
def test_bad_options_exit_2_without_output(model_dirs, prompt_file, tmp_path, capsys, extra, message):
    out = tmp_path / "o.csv"
    argv = [
        "compress",
        "--model",
        str(model_dirs["llama"]),
        "--prompt-file",
        str(prompt_file),
        "--csv",
        str(out),
    ]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlens: error:") and message in err and "\n" not in err
    assert not out.exists()


def test_bad_files_exit_2(model_dirs, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    llama = str(model_dirs["llama"])
    cases = [
        (["--model", llama, "--prompt-file", str(empty)], "is empty"),
        (["--model", llama, "--prompt-file", str(tmp_path / "missing.txt")], "does not exist"),
        (["--model", str(tmp_path), "--prompt-file", str(empty)], "is empty"),
    ]
    good = tmp_path / "p.txt"
    good.write_text(PROMPT)
    cases.append((["--model", str(tmp_path), "--prompt-file", str(good)], "not a model folder"))
    cases.append(
        (
            ["--model", llama, "--prompt-file", str(good), "--csv", str(tmp_path / "no/x.csv")],
            "does not exist",
        )
    )
    for argv, message in cases:
        assert main(["compress", *argv]) == 2
        assert message in capsys.readouterr().err


def test_uncapturable_architecture_exits_2(tmp_path, prompt_file):
    folder = build_model(tmp_path / "gemma2", "gemma2")
    out = tmp_path / "x.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "app", "compress", "--model", str(folder), "--prompt-file", str(prompt_file)]
        + ["--csv", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "scaled_dot_product_attention" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("where", ["folder", "missing parent"])
def test_output_paths_are_checked_before_any_work(tmp_path, prompt_file, capsys, where):
    out = tmp_path if where == "folder" else tmp_path / "nowhere" / "s.csv"
    argv = ["compress", "--model", str(tmp_path / "no-such-model"), "--prompt-file", str(prompt_file)]
    assert main([*argv, "--csv", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlens: error: cannot write") and "\n" not in err  # before the model is looked at
    assert ("is a folder" in err) if where == "folder" else ("does not exist" in err)


@pytest.mark.parametrize(
    "argv", [["compress", "--ratio", "lots"], ["compress", "--schedule", "x"], ["nope"], ["sweep", "--bogus"]]
)
def test_argument_errors_are_one_line(argv):
    proc = subprocess.run([sys.executable, "-m", "app", *argv], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvlens: error:") and "--help" in lines[0]


@pytest.mark.parametrize("source", ["-p", "--prompt -"])
def test_prompt_text_and_stdin_give_the_file_prompt(model_dirs, loaded_models, tmp_path, monkeypatch, source):
    """`-p TEXT` (with mlx-lm's literal \\n) and `--prompt -` prefill the same tokens as the file would."""
    import io

    kept = tmp_path / "kept.json"
    argv = ["compress", "--model", str(model_dirs["llama"]), "--max-tokens", "2", "--positions", str(kept)]
    if source == "-p":
        argv += ["-p", PROMPT.replace("\n", "\\n")]
    else:
        argv += ["--prompt", "-"]
        monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))
    assert main(argv) == 0
    tokenizer = loaded_models["llama"][1]
    assert json.loads(kept.read_text())["prompt_tokens"] == tokenizer.encode(PROMPT)


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "no prompt given: pass --prompt TEXT"),
        (["-p", "  "], "--prompt is empty"),
        (["--prompt", "-"], "standard input was empty"),
    ],
)
def test_missing_prompt_is_one_line_before_loading(tmp_path, monkeypatch, capsys, argv, message):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["compress", "--model", str(tmp_path / "no-such-model"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlens: error:") and message in err and "\n" not in err


def test_two_prompt_sources_are_refused_in_one_line(prompt_file, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compress", "-p", "hello there", "--prompt-file", str(prompt_file)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "not allowed with argument" in err and "\n" not in err


@pytest.mark.parametrize("command", ["compress", "sweep"])
def test_help_lists_every_method(command, capsys):
    from kvcore.methods import available

    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 0
    bare = [name for name in available() if "-" not in name]
    assert len(bare) > 20 and all(name in out for name in bare)
    assert "WRAPPER-METHOD" in out and "A+B" in out


@pytest.mark.parametrize(
    ("method", "extra", "want"),
    [
        ("pyramidkv", ["--param", "beta=10", "--window", "16"], ("1", "16", "5", "4", "beta=10")),
        ("tova", [], ("0", "64", "5", "4", "")),  # tova keeps one set of positions for every kv-head
        ("adakv-random", ["--param", "seed=3"], ("1", "64", "5", "4", "seed=3;alpha=0.2")),
    ],
)
def test_stats_and_sweep_csvs_carry_every_setting_that_changes_a_result(
    model_dirs, prompt_file, tmp_path, method, extra, want
):
    stats, sweep = tmp_path / "stats.csv", tmp_path / "sweep.csv"
    argv = ["--model", str(model_dirs["llama"]), "--prompt-file", str(prompt_file), "--tokens", "2", *extra]
    assert main(["compress", *argv, "--method", method, "--csv", str(stats)]) == 0
    assert main(["sweep", *argv, "--methods", method, "--ratios", "0.5", "--csv", str(sweep)]) == 0
    for path in (stats, sweep):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        cells = {
            tuple(r[c] for c in ("per_head", "window", "kernel", "n_sink", "method_params")) for r in rows
        }
        assert cells == {want}, path.name
        assert {r["baseline_dtype"] for r in rows} == {
            "float32"
        }  # MLX's CPU backend runs the cache in float32


def test_methods_lists_every_method_with_its_definition_and_parameters(capsys):
    from kvcore import methods

    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    listed = [line.split(":", 1)[0] for line in out.splitlines() if not line.startswith(" ")]
    assert listed == list(methods.available())
    assert "    --param beta=20" in out and "pyramid steepness" in out
    assert f"adakv-h2o: {methods.describe('adakv-h2o')}" in out
