"""Render the KV Lens icon from its SVG: the 1024 px PNG, a macOS .iconset and an .icns.

    python packaging/make_icons.py            # from the repository root (any OS; needs PySide6 only)

Writes
  resources/icons/kvlens.png         1024 x 1024, used by the app window and the docs
  packaging/KVLens.iconset/          the ten PNGs `iconutil` expects (16 ... 512, each also @2x)
  packaging/KVLens.icns              the .icns that packaging/kvlens.spec puts in the .app

On a Mac, `iconutil -c icns packaging/KVLens.iconset -o packaging/KVLens.icns` builds the same .icns with
Apple's tool; prefer it for a release. Off a Mac there is no iconutil, so this script writes the .icns itself:
the format is a big-endian container ('icns', total length) of (OSType, length, PNG data) chunks, and since
macOS 10.7 every chunk type used here holds plain PNG data (see `ICNS_TYPES`).

Rendering uses Qt's SVG renderer (QtSvg ships in PySide6-Essentials) on the offscreen platform, so it runs
headless.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SVG = ROOT / "resources" / "icons" / "kvlens.svg"
PNG = ROOT / "resources" / "icons" / "kvlens.png"
ICONSET = ROOT / "packaging" / "KVLens.iconset"
ICNS = ROOT / "packaging" / "KVLens.icns"

#: file name in the .iconset -> pixel size (what `iconutil -c icns` reads).
ICONSET_SIZES: dict[str, int] = {
    f"icon_{pt}x{pt}{suffix}.png": pt * scale
    for pt in (16, 32, 128, 256, 512)
    for suffix, scale in (("", 1), ("@2x", 2))
}

#: icns chunk type -> (pixel size, iconset file it is taken from). PNG payloads for all of them (10.7+).
ICNS_TYPES: dict[bytes, tuple[int, str]] = {
    b"icp4": (16, "icon_16x16.png"),
    b"icp5": (32, "icon_32x32.png"),
    b"ic11": (32, "icon_16x16@2x.png"),
    b"ic12": (64, "icon_32x32@2x.png"),
    b"ic07": (128, "icon_128x128.png"),
    b"ic13": (256, "icon_128x128@2x.png"),
    b"ic08": (256, "icon_256x256.png"),
    b"ic14": (512, "icon_256x256@2x.png"),
    b"ic09": (512, "icon_512x512.png"),
    b"ic10": (1024, "icon_512x512@2x.png"),
}


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; raises ValueError if `data` is not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return struct.unpack(">II", data[16:24])


def render(svg: Path, size: int):
    """The SVG rendered to a size x size QImage with a transparent background."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg}: Qt could not parse this SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    return image


def write_icns(iconset: Path, out: Path) -> None:
    chunks = []
    for ostype, (size, name) in ICNS_TYPES.items():
        data = (iconset / name).read_bytes()
        if png_size(data) != (size, size):
            raise SystemExit(f"{name}: expected {size}x{size}, got {png_size(data)}")
        chunks.append(ostype + struct.pack(">I", 8 + len(data)) + data)
    body = b"".join(chunks)
    out.write_bytes(b"icns" + struct.pack(">I", 8 + len(body)) + body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-icns", action="store_true", help="skip writing packaging/KVLens.icns")
    args = parser.parse_args(argv)

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])

    PNG.parent.mkdir(parents=True, exist_ok=True)
    if not render(SVG, 1024).save(str(PNG), "PNG"):
        raise SystemExit(f"could not write {PNG}")
    print(f"wrote {PNG.relative_to(ROOT)}")

    ICONSET.mkdir(parents=True, exist_ok=True)
    for stale in ICONSET.glob("*.png"):
        if stale.name not in ICONSET_SIZES:
            stale.unlink()
    for name, size in ICONSET_SIZES.items():
        # Render each size from the vector source (sharper than downscaling the 1024 PNG).
        if not render(SVG, size).save(str(ICONSET / name), "PNG"):
            raise SystemExit(f"could not write {ICONSET / name}")
    print(f"wrote {ICONSET.relative_to(ROOT)}/ ({len(ICONSET_SIZES)} PNGs)")

    if not args.no_icns:
        write_icns(ICONSET, ICNS)
        print(f"wrote {ICNS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
