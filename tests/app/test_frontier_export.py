"""`kvlens sweep --plot`: the app's frontier widget writes the PNG/SVG headless, next to the same CSV."""

import csv
import struct

from app.__main__ import main
from kvcore.measure.export import SWEEP_COLUMNS

PROMPT = (
    "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog.\n"
)


def test_sweep_plot_writes_png_and_svg_beside_the_csv(model_dirs, tmp_path, qapp):
    prompt = tmp_path / "p.txt"
    prompt.write_text(PROMPT)
    argv = ["sweep", "--model", str(model_dirs["llama"]), "--prompt-file", str(prompt), "--tokens", "3"]
    argv += ["--methods", "snapkv,knorm", "--ratios", "0.25,0.5", "--csv", str(tmp_path / "s.csv")]
    for suffix in ("png", "svg"):
        out = tmp_path / f"frontier.{suffix}"
        assert main([*argv, "--plot", str(out), "--metric", "agreement"]) == 0
        data = out.read_bytes()
        if suffix == "png":
            assert data[:8] == b"\x89PNG\r\n\x1a\n"
            width, height = struct.unpack(">II", data[16:24])
            assert width == 1000 and height > 100
        else:
            assert b"<svg" in data and b"knorm" in data  # the legend names each method
    with open(tmp_path / "s.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(SWEEP_COLUMNS)
    assert {(r["method"], r["retention_ratio"]) for r in rows} == {
        (m, r) for m in ("snapkv", "knorm") for r in ("0.25", "0.5")
    }
