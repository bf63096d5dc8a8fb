import subprocess
import sys

import kvcore


def test_version_flag_prints_version():
    out = subprocess.run(
        [sys.executable, "-m", "app", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"kvlens {kvcore.__version__}"


def test_cli_subcommand_does_not_import_qt():
    code = (
        "import sys\nfrom app.__main__ import main\ntry:\n    rc = main(['nosuchcmd'])\n"
        "except SystemExit as e:\n    rc = e.code\n"
        "print(rc, any(m.startswith('PySide6') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2", "False"]
