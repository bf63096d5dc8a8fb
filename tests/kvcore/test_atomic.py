"""Atomic writes (issue 42, items 2 and 5): the replaced file's permission bits are kept, a new file gets the
umask's, and temp files a killed write left beside the file are removed by the next write of that file."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kvcore.atomic import stale_temp_files, temp_prefix_suffix, write_text

ROOT = Path(__file__).resolve().parents[2]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o664, 0o640])
def test_overwriting_keeps_the_files_permission_bits(tmp_path, mode):
    path = tmp_path / "out.csv"
    path.write_text("old")
    path.chmod(mode)
    write_text(path, "new")
    assert path.read_text() == "new" and _mode(path) == mode


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_honours_the_umask(tmp_path, umask, mode):
    code = (
        "import os, sys; os.umask(int(sys.argv[1], 8)); from kvcore.atomic import write_text; "
        "write_text(sys.argv[2], 'x')"
    )
    path = tmp_path / "new.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code, oct(umask)[2:], str(path)], check=True, env=env)
    assert _mode(path) == mode


def test_the_next_write_removes_temp_files_a_killed_write_left(tmp_path):
    path = tmp_path / "s.kvlens"
    prefix, suffix = temp_prefix_suffix(path)
    stale = [tmp_path / f"{prefix}{tag}{suffix}" for tag in ("abcd_123", "zz9yy8xx")]
    others = [
        tmp_path / f"{prefix}abcd_123.tmp.csv",  # another suffix: another file's temp
        tmp_path / f".t.abcd_123{suffix}",  # another stem
        tmp_path / f"{prefix}toolongname{suffix}",  # not mkstemp's eight characters
    ]
    for f in (*stale, *others):
        f.write_bytes(b"half")
    assert sorted(stale_temp_files(path)) == sorted(stale)
    write_text(path, "whole")
    assert path.read_text() == "whole"
    assert not any(f.exists() for f in stale) and all(f.exists() for f in others)


def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path):
    path = tmp_path / "o.csv"
    path.write_text("old")
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100)); "
        "from kvcore.atomic import write_text\n"
        "try:\n    write_text(sys.argv[1], 'x' * 1000)\n"
        "except OSError as e:\n    print(e.errno, e.filename)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env)
    assert done.stdout.split() == ["27", str(path)]  # EFBIG, the destination (not the temp file)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["o.csv"]


def test_a_temp_file_of_a_write_in_progress_is_left_alone(tmp_path):
    """Two writers of one file: the second's start must not delete the first's temp file mid-write."""
    from kvcore.atomic import atomic_path

    path = tmp_path / "out.csv"
    with atomic_path(path) as first_tmp:
        first_tmp.write_text("first")
        write_text(path, "second")  # starts while the first write is still open
        assert first_tmp.exists()
    assert path.read_text() == "first" and stale_temp_files(path) == []


def test_a_write_killed_midway_leaves_a_temp_file_the_next_write_removes(tmp_path):
    path = tmp_path / "s.kvlens"
    path.write_bytes(b"old session")
    code = (
        "import os, signal, sys; from kvcore.atomic import atomic_path\n"
        "with atomic_path(sys.argv[1]) as tmp:\n"
        "    tmp.write_bytes(b'half a session')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, str(path)], env=env)
    assert done.returncode == -9
    assert path.read_bytes() == b"old session" and len(stale_temp_files(path)) == 1  # the leftover
    write_text(path, "new session")
    assert path.read_text() == "new session" and os.listdir(tmp_path) == ["s.kvlens"]
