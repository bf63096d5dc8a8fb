"""Adversarial inputs (issue 42): every bad file, argument, session, results file and filesystem fault exits 2 with
exactly one `kvlens: error:` line naming the problem, no traceback, no file of the work folder changed (bytes and
mode) and no temp file left.

Each case builds its inputs in a fresh folder and runs the CLI in this process (`kvcore.cli.main.main`); a full
disk (RLIMIT_FSIZE) runs in a subprocess, which alone can carry the limit.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvcore.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
PROMPT = "def area(width, height):\n    return width * height\nThe quick brown fox jumps over the lazy dog.\n"
TEMP = re.compile(r"^\..*\.tmp")
SET_GRID = ["--methods", "snapkv", "--ratios", "0.5", "--bits", "16", "--tokens", "2"]


@dataclass
class Case:
    """The arguments of one bad run, what its error line must say, and its standard input (bytes or a file)."""

    argv: list[str]
    says: str
    stdin: bytes | Path | None = None


@pytest.fixture(scope="module")
def inputs(model_dirs, tmp_path_factory):
    """A saved session and a good prompt-set results file, built once: the cases forge copies of them."""
    from kvcore.engine.session import Session
    from kvcore.engine.session_file import save_session

    root = tmp_path_factory.mktemp("adversarial")
    session = Session.load(str(model_dirs["llama"]))
    session.prefill(PROMPT * 2, n_tokens=4)
    save_session(root / "s.kvlens", session)
    prompts = _jsonl(root / "set.jsonl")
    out = root / "good.csv"
    argv = [
        "sweep",
        "--model",
        str(model_dirs["llama"]),
        "--prompts",
        str(prompts),
        *SET_GRID,
        "--csv",
        str(out),
    ]
    assert main(argv) == 0
    return {"session": root / "s.kvlens", "results": out, "model": model_dirs["llama"]}


def _jsonl(path: Path, *extra: str) -> Path:
    lines = [json.dumps({"id": f"doc{i}", "prompt": PROMPT * (i + 1)}) for i in range(2)]
    path.write_text("\n".join([*lines, *extra]) + "\n")
    return path


# -- case builders: each gets (work folder, inputs) and returns the Case -----------------------------------


def _compress(model: Path, *args: str) -> list[str]:
    return ["compress", "--model", str(model), "--tokens", "2", *args]


def _prompt_file(w: Path, name: str = "in.txt") -> Path:
    (w / name).write_text(PROMPT)
    return w / name


def case_csv_is_the_prompt_file(w, x):
    p = _prompt_file(w)
    return Case(_compress(x["model"], "--prompt-file", str(p), "--csv", str(p)), "is the --prompt-file input")


def case_csv_is_the_positions_file(w, x):
    (w / "o.json").write_text("{}")
    argv = _compress(x["model"], "-p", PROMPT, "--csv", str(w / "o.json"), "--positions", str(w / "o.json"))
    return Case(argv, "are the same file")


def case_timeline_is_the_prompt_file(w, x):
    p = _prompt_file(w)
    argv = _compress(x["model"], "--prompt-file", str(p), "--decode-method", "knorm", "--decode-budget", "8")
    return Case([*argv, "--timeline", str(p)], "is the --prompt-file input")


def case_timeline_is_the_csv(w, x):
    argv = _compress(x["model"], "-p", PROMPT, "--decode-method", "knorm", "--decode-budget", "8")
    return Case([*argv, "--csv", str(w / "o.csv"), "--timeline", str(w / "o.csv")], "are the same file")


def case_csv_is_the_questions_file(w, x):
    p = _prompt_file(w)
    q = w / "q.jsonl"
    q.write_text('{"question": "what?"}\n')
    argv = _compress(x["model"], "--context-file", str(p), "--questions", str(q), "--csv", str(q))
    return Case(argv, "is the --questions input")


def case_ruler_plot_is_its_table(w, x):
    out = str(w / "t.csv")
    argv = [
        "ruler",
        "--model",
        str(x["model"]),
        "--length",
        "200",
        "--samples",
        "1",
        "--out",
        out,
        "--plot",
        out,
    ]
    return Case(argv, "are the same file")


def case_csv_is_a_hard_link_to_the_prompt(w, x):
    p = _prompt_file(w)
    os.link(p, w / "link.csv")
    return Case(_compress(x["model"], "--prompt-file", str(p), "--csv", str(w / "link.csv")), "input")


def case_csv_is_a_symlink_to_the_prompt(w, x):
    p = _prompt_file(w)
    (w / "sym.csv").symlink_to(p)
    return Case(_compress(x["model"], "--prompt-file", str(p), "--csv", str(w / "sym.csv")), "input")


def case_csv_is_the_prompt_by_a_dotdot_path(w, x):
    p = _prompt_file(w)
    (w / "sub").mkdir()
    return Case(_compress(x["model"], "--prompt-file", str(p), "--csv", f"{w}/sub/../in.txt"), "input")


def case_csv_is_the_jsonl_prompt_set(w, x):
    s = _jsonl(w / "set.jsonl")
    return Case(["sweep", "--model", str(x["model"]), "--prompts", str(s), "--csv", str(s)], "--prompts")


def case_csv_is_a_file_of_the_prompt_folder(w, x):
    (w / "docs").mkdir()
    _prompt_file(w / "docs", "a.txt")
    argv = ["sweep", "--model", str(x["model"]), "--prompts", str(w / "docs"), "--csv", str(w / "docs/a.txt")]
    return Case(argv, "--prompts")


def case_probe_csv_is_the_prompt_set(w, x):
    s = _jsonl(w / "set.jsonl")
    return Case(["probe", "--model", str(x["model"]), "--prompts", str(s), "--csv", str(s)], "--prompts")


def case_csv_is_the_session_file(w, x):
    shutil.copy(x["session"], w / "s.kvlens")
    argv = _compress(x["model"], "--session", str(w / "s.kvlens"), "--csv", str(w / "s.kvlens"))
    return Case(argv, "--session")


def case_csv_is_the_models_config(w, x):
    model = shutil.copytree(x["model"], w / "model")
    return Case(_compress(model, "-p", PROMPT, "--csv", str(model / "config.json")), "--model")


def case_csv_is_the_file_on_standard_input(w, x):
    p = _prompt_file(w)
    return Case(_compress(x["model"], "--prompt", "-", "--csv", str(p)), "standard input", stdin=p)


def case_prompt_file_is_a_fifo(w, x):
    os.mkfifo(w / "fifo.txt")
    return Case(_compress(x["model"], "--prompt-file", str(w / "fifo.txt")), "not a regular file")


def case_prompt_file_is_dev_zero(w, x):
    return Case(_compress(x["model"], "--prompt-file", "/dev/zero"), "not a regular file")


def case_prompt_file_is_over_the_size_cap(w, x):
    with open(w / "huge.txt", "wb") as f:
        f.truncate(9 * 1024 * 1024)  # sparse: no disk used
    return Case(_compress(x["model"], "--prompt-file", str(w / "huge.txt")), "-byte limit")


def case_prompt_file_is_a_folder(w, x):
    (w / "d.txt").mkdir()
    return Case(_compress(x["model"], "--prompt-file", str(w / "d.txt")), "is a folder")


def case_prompt_file_is_not_utf8(w, x):
    (w / "bad.txt").write_bytes(b"def f(\xff):\n    pass\n")
    return Case(_compress(x["model"], "--prompt-file", str(w / "bad.txt")), "not UTF-8")


def case_prompt_file_is_empty(w, x):
    (w / "empty.txt").write_text("  \n")
    return Case(_compress(x["model"], "--prompt-file", str(w / "empty.txt")), "is empty")


def case_prompt_file_does_not_exist(w, x):
    return Case(_compress(x["model"], "--prompt-file", str(w / "nope.txt")), "does not exist")


def case_stdin_is_not_utf8(w, x):
    return Case(_compress(x["model"], "--prompt", "-"), "standard input is not UTF-8", stdin=b"def f(\xff):")


def case_argv_is_not_utf8(w, x):
    return Case(_compress(x["model"], "-p", "def f(\udcff):"), "--prompt: the argument is not UTF-8")


def _set_case(w: Path, x: dict, prompts: Path, says: str, *extra: str) -> Case:
    argv = [
        "sweep",
        "--model",
        str(x["model"]),
        "--prompts",
        str(prompts),
        *SET_GRID,
        "--csv",
        str(w / "o.csv"),
    ]
    return Case([*argv, *extra], says)


def case_jsonl_nested_too_deeply(w, x):
    deep = '{"id": "x", "prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"
    return _set_case(w, x, _jsonl(w / "set.jsonl", deep), "set.jsonl:3: JSON nested too deeply")


def case_jsonl_id_is_a_lone_surrogate(w, x):
    return _set_case(w, x, _jsonl(w / "set.jsonl", '{"id": "\\ud800", "prompt": "x y"}'), "set.jsonl:3")


def case_jsonl_prompt_is_a_lone_surrogate(w, x):
    line = '{"id": "s", "prompt": "a \\udfff b"}'
    return _set_case(w, x, _jsonl(w / "set.jsonl", line), "lone surrogate")


def case_jsonl_file_is_over_the_size_cap(w, x):
    with open(w / "big.jsonl", "wb") as f:
        f.truncate(300 * 1024 * 1024)
    return _set_case(w, x, w / "big.jsonl", "-byte limit")


def case_prompt_folder_is_over_the_size_cap(w, x):
    (w / "docs").mkdir()
    for i in range(40):  # 40 × 7 MiB sparse files: each under the prompt cap, together over the set's
        with open(w / "docs" / f"{i:02}.txt", "wb") as f:
            f.write(b"def f(): pass\n")
            f.truncate(7 * 1024 * 1024)
    return _set_case(w, x, w / "docs", "-byte limit of a set")


def case_jsonl_prompt_is_over_the_size_cap(w, x):
    line = json.dumps({"id": "big", "prompt": "word " * (2 * 1024 * 1024)})
    return _set_case(w, x, _jsonl(w / "set.jsonl", line), "set.jsonl:3: the prompt is over")


def case_jsonl_is_a_fifo(w, x):
    os.mkfifo(w / "set.jsonl")
    return _set_case(w, x, w / "set.jsonl", "not a regular file")


def case_jsonl_is_not_utf8(w, x):
    (w / "set.jsonl").write_bytes(b'{"id": "a", "prompt": "\xff"}\n')
    return _set_case(w, x, w / "set.jsonl", "not UTF-8")


def case_jsonl_repeats_an_id(w, x):
    return _set_case(w, x, _jsonl(w / "set.jsonl", '{"id": "doc0", "prompt": "x y"}'), "already used")


def _model_with(w: Path, x: dict, **edits) -> Path:
    model = shutil.copytree(x["model"], w / "model")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **edits}))
    return model


def case_model_type_with_a_dot(w, x):
    return Case(_compress(_model_with(w, x, model_type="llama.foo"), "-p", PROMPT), "'llama.foo'")


def case_vocab_size_negative(w, x):
    return Case(_compress(_model_with(w, x, vocab_size=-5), "-p", PROMPT), "vocab_size -5")


def case_hidden_size_text(w, x):
    return Case(_compress(_model_with(w, x, hidden_size="abc"), "-p", PROMPT), "hidden_size 'abc'")


def case_sweep_bits_listed_twice(w, x):
    argv = ["sweep", "--model", str(x["model"]), "-p", PROMPT, "--methods", "snapkv", "--ratios", "0.5"]
    return Case([*argv, "--bits", "4,4", "--group-size", "32"], "appears twice")


def case_probe_method_listed_twice(w, x):
    argv = [
        "probe",
        "--model",
        str(x["model"]),
        "--methods",
        "snapkv,snapkv",
        "--ratios",
        "0.5",
        "--bits",
        "16",
    ]
    return Case(argv, "appears twice")


def _resume_case(w: Path, x: dict, edit: Callable[[str], str] | bytes, says: str) -> Case:
    out = w / "o.csv"
    if isinstance(edit, bytes):
        out.write_bytes(edit)
    else:
        out.write_text(edit(x["results"].read_text()))
    return _set_case(w, x, _jsonl(w / "set.jsonl"), says, "--resume")


def _cell(text: str, column: str, value: str, row: int = 1) -> str:
    lines = text.splitlines()
    header = lines[0].split(",")
    cells = lines[row].split(",")
    cells[header.index(column)] = value
    lines[row] = ",".join(cells)
    return "\n".join(lines) + "\n"


def case_resume_with_duplicated_rows(w, x):
    return _resume_case(w, x, lambda t: t + "".join(t.splitlines(True)[1:4]), "repeats the row on line")


def case_resume_with_a_formula_cell(w, x):
    edit = lambda t: _cell(t, "budget_note", "=cmd|' /C calc'!A0")  # noqa: E731
    return _resume_case(w, x, edit, "o.csv:2: budget_note")


def case_resume_with_text_in_a_number_column(w, x):
    return _resume_case(
        w, x, lambda t: _cell(t, "kl_mean", "abc", 3), "o.csv:4: kl_mean 'abc' is not a number"
    )


def case_resume_with_a_padded_number(w, x):
    return _resume_case(w, x, lambda t: _cell(t, "tokens_kept", " 12", 2), "o.csv:3: tokens_kept")


def case_resume_with_a_truncated_row(w, x):
    return _resume_case(w, x, lambda t: t[: len(t) - 40], "cells, the header")


def case_resume_with_a_row_deleted(w, x):
    return _resume_case(
        w, x, lambda t: "".join(t.splitlines(True)[:2] + t.splitlines(True)[3:]), "rows were cut"
    )


def case_resume_with_a_binary_file(w, x):
    return _resume_case(w, x, bytes(range(256)) * 4, "o.csv is not a text file")


def case_resume_with_a_nul_byte(w, x):
    return _resume_case(w, x, lambda t: t.replace("snapkv", "snap\x00kv", 1), "not a text file")


def case_resume_with_other_columns(w, x):
    return _resume_case(w, x, lambda t: "a,b,c\n1,2,3\n", "its columns differ")


def case_resume_with_a_prompt_not_in_the_set(w, x):
    return _resume_case(w, x, lambda t: t.replace("\ndoc1,", "\ndocX,"), "'docX'")


def case_resume_file_is_a_fifo(w, x):
    os.mkfifo(w / "o.csv")
    return _set_case(w, x, _jsonl(w / "set.jsonl"), "not a regular file", "--resume")


def _forged_session(w: Path, x: dict, edit_table: Callable[[dict], dict] | None = None) -> Path:
    """A copy of the session whose safetensors JSON table `edit_table` rewrites (the arrays left as they are)."""
    raw = x["session"].read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    table = json.loads(raw[8 : 8 + n])
    if edit_table is not None:
        table = edit_table(table)
    head = json.dumps(table).encode()
    head += b" " * (-len(head) % 8)
    path = w / "forged.kvlens"
    path.write_bytes(struct.pack("<Q", len(head)) + head + raw[8 + n :])
    return path


def _session_case(w, x, path: Path, says: str) -> Case:
    return Case(_compress(x["model"], "--session", str(path), "--csv", str(w / "o.csv")), says)


def case_session_metadata_is_a_list(w, x):
    path = _forged_session(w, x, lambda t: {**t, "__metadata__": ["kvlens"]})
    return _session_case(w, x, path, "__metadata__ must be an object")


def case_session_metadata_is_a_string(w, x):
    path = _forged_session(w, x, lambda t: {**t, "__metadata__": "kvlens kvlens"})
    return _session_case(w, x, path, "__metadata__ must be an object")


def case_session_metadata_is_a_number(w, x):
    path = _forged_session(w, x, lambda t: {**t, "__metadata__": {"kvlens": 12345}})
    return _session_case(w, x, path, "__metadata__ must be an object")


def case_session_metadata_is_nested_too_deeply(w, x):
    path = _forged_session(w, x, lambda t: {**t, "__metadata__": {"kvlens": "[" * 100_000 + "]" * 100_000}})
    return _session_case(w, x, path, "nested too deeply")


def case_session_with_zero_d_logits_resealed(w, x):
    import mlx.core as mx

    from kvcore.cache import files as cache_io
    from kvcore.engine.session_file import FORMAT, VERSION

    header, arrays = cache_io.read_file(x["session"], FORMAT, VERSION)
    arrays["logits.full"] = mx.array(1.0)
    cache_io.write_file(w / "zero_d.kvlens", arrays, header)
    return _session_case(w, x, w / "zero_d.kvlens", "logits.full has 0 dimensions")


def case_session_digest_broken(w, x):
    def edit(t):
        header = json.loads(t["__metadata__"]["kvlens"])
        header["prefill_ms"] = 1.0
        return {**t, "__metadata__": {"kvlens": json.dumps(header)}}

    return _session_case(w, x, _forged_session(w, x, edit), "digest mismatch")


def case_session_truncated(w, x):
    (w / "cut.kvlens").write_bytes(x["session"].read_bytes()[:5000])
    return _session_case(w, x, w / "cut.kvlens", "truncated")


def case_session_is_garbage(w, x):
    (w / "junk.kvlens").write_bytes(b"\x07" * 64)
    return _session_case(w, x, w / "junk.kvlens", "junk.kvlens")


def case_session_is_a_fifo(w, x):
    os.mkfifo(w / "pipe.kvlens")
    return _session_case(w, x, w / "pipe.kvlens", "not a regular file")


def case_session_is_dev_zero(w, x):
    return _session_case(w, x, Path("/dev/zero"), "/dev/zero: not a regular file")


def case_csv_is_the_plot(w, x):
    argv = [
        "sweep",
        "--model",
        str(x["model"]),
        "-p",
        PROMPT,
        "--csv",
        str(w / "f.png"),
        "--plot",
        str(w / "f.png"),
    ]
    return Case(argv, "are the same file")


def case_output_parent_is_a_file(w, x):
    _prompt_file(w)
    return Case(_compress(x["model"], "-p", PROMPT, "--csv", str(w / "in.txt" / "o.csv")), "does not exist")


def case_output_is_a_folder(w, x):
    (w / "o.csv").mkdir()
    return Case(_compress(x["model"], "-p", PROMPT, "--csv", str(w / "o.csv")), "it is a folder")


CASES = {name[5:]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under `folder`: its mode, and a regular file's size and SHA-256 (sparse giants: size only)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            digest = None
            if stat.S_ISREG(st.st_mode) and st.st_size < 32 * 1024 * 1024:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
            out[str(p.relative_to(folder))] = (st.st_mode, st.st_size, digest)
    return out


def temp_files(folder: Path) -> list[str]:
    return [n for _, _, names in os.walk(folder) for n in names if TEMP.match(n)]


def error_lines(err: str) -> list[str]:
    """stderr's lines other than the progress bar's (a bar line is redrawn with \\r)."""
    return [line for line in err.split("\n") if line.strip() and not line.startswith("\r[")]


def assert_refused(rc: int, err: str, says: str, before: dict, work: Path) -> None:
    lines = error_lines(err)
    assert rc == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("kvlens: error: "), lines
    assert says in lines[0], lines[0]
    assert snapshot(work) == before
    assert temp_files(work) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line_and_changes_nothing(name, inputs, tmp_path, capsys, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    case = CASES[name](work, inputs)
    before = snapshot(work)
    if isinstance(case.stdin, bytes):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(case.stdin), encoding="utf-8"))
    elif case.stdin is not None:
        monkeypatch.setattr(sys, "stdin", open(case.stdin, encoding="utf-8"))  # noqa: SIM115 (closed by GC)
    try:
        rc = main(case.argv)
    except SystemExit as exc:
        rc = exc.code
    assert_refused(rc, capsys.readouterr().err, case.says, before, work)


def test_there_are_at_least_40_cases():
    assert len(CASES) >= 40


# -- filesystem faults mid-run -----------------------------------------------------------------------------

_LIMITED = (
    "import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
    "from kvcore.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


def _run_with_file_size_limit(argv: list[str], limit: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    code = _LIMITED.format(limit=limit)
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, env=env, timeout=300, cwd=ROOT
    )


@pytest.mark.parametrize("prompt_set", [False, True], ids=["sweep", "sweep-prompts"])
def test_a_full_disk_mid_write_exits_2_and_keeps_the_old_file(prompt_set, inputs, tmp_path):
    out = tmp_path / "o.csv"
    out.write_text("old,results\n1,2\n")
    out.chmod(0o640)
    if prompt_set:
        source = ["--prompts", str(_jsonl(tmp_path / "set.jsonl")), *SET_GRID]
    else:
        source = ["-p", PROMPT, "--methods", "snapkv", "--ratios", "0.5", "--bits", "16", "--tokens", "2"]
    before = snapshot(tmp_path)
    done = _run_with_file_size_limit(
        ["sweep", "--model", str(inputs["model"]), *source, "--csv", str(out)], 1500
    )
    assert_refused(
        done.returncode, done.stderr.decode(), f"{out}: File too large; free space", before, tmp_path
    )


def test_a_full_disk_while_the_plot_is_written_exits_2_and_keeps_the_old_plot(inputs, tmp_path):
    plot = tmp_path / "frontier.png"
    plot.write_bytes(b"old plot")
    argv = [
        "sweep",
        "--model",
        str(inputs["model"]),
        "-p",
        PROMPT,
        "--methods",
        "snapkv,h2o",
        "--ratios",
        "0.5",
    ]
    argv += ["--bits", "16", "--tokens", "2", "--plot", str(plot)]
    before = snapshot(tmp_path)
    code = _LIMITED.format(limit=2000).replace("kvcore.cli.main", "app.__main__")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "QT_QPA_PLATFORM": "offscreen",
    }
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, env=env, timeout=300, cwd=ROOT
    )
    assert_refused(done.returncode, done.stderr.decode(), str(plot), before, tmp_path)


def _vanish_after_first_round(monkeypatch, action: Callable[[], None]) -> None:
    """Run `action` after the prompt set's first round (its progress callback), as a user or a disk would."""
    from kvcore.cli import prompt_sets

    draw = prompt_sets._progress
    calls = []

    def progress(*a):
        draw(*a)
        calls.append(a)
        if len(calls) == 1:
            action()

    monkeypatch.setattr(prompt_sets, "_progress", progress)


def test_the_output_folder_removed_mid_run_exits_2_with_one_line(inputs, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "out"
    folder.mkdir()
    _vanish_after_first_round(monkeypatch, lambda: shutil.rmtree(folder))
    argv = ["sweep", "--model", str(inputs["model"]), "--prompts", str(_jsonl(tmp_path / "set.jsonl"))]
    rc = main([*argv, *SET_GRID, "--csv", str(folder / "o.csv")])
    lines = error_lines(capsys.readouterr().err)
    assert rc == 2 and len(lines) == 1 and "folder does not exist" in lines[0], lines
    assert not folder.exists() and temp_files(tmp_path) == []


def test_a_folder_in_the_outputs_place_mid_run_exits_2_with_one_line(inputs, tmp_path, capsys, monkeypatch):
    out = tmp_path / "o.csv"

    def replace_with_folder():
        out.unlink()
        out.mkdir()

    _vanish_after_first_round(monkeypatch, replace_with_folder)
    argv = ["sweep", "--model", str(inputs["model"]), "--prompts", str(_jsonl(tmp_path / "set.jsonl"))]
    rc = main([*argv, *SET_GRID, "--csv", str(out)])
    lines = error_lines(capsys.readouterr().err)
    assert rc == 2 and len(lines) == 1 and f"{out}: Is a directory" in lines[0], lines
    assert out.is_dir() and list(out.iterdir()) == [] and temp_files(tmp_path) == []
