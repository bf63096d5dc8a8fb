"""What can be checked about the macOS packaging without a Mac and without PyInstaller.

The spec is compiled, never executed; its UPPER_CASE constants are read from the syntax tree.
"""

from __future__ import annotations

import ast
import contextlib
import plistlib
import re
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"
SPEC = PACKAGING / "kvlens.spec"
ICONSET = PACKAGING / "KVLens.iconset"

# The ten files `iconutil -c icns` expects in an .iconset, and their pixel sizes.
EXPECTED_ICONSET = {
    "icon_16x16.png": 16,
    "icon_16x16@2x.png": 32,
    "icon_32x32.png": 32,
    "icon_32x32@2x.png": 64,
    "icon_128x128.png": 128,
    "icon_128x128@2x.png": 256,
    "icon_256x256.png": 256,
    "icon_256x256@2x.png": 512,
    "icon_512x512.png": 512,
    "icon_512x512@2x.png": 1024,
}
# icns chunk type -> pixel size, for the PNG-payload types (macOS 10.7+).
ICNS_SIZES = {
    b"icp4": 16,
    b"icp5": 32,
    b"ic11": 32,
    b"ic12": 64,
    b"ic07": 128,
    b"ic13": 256,
    b"ic08": 256,
    b"ic14": 512,
    b"ic09": 512,
    b"ic10": 1024,
}


def kvcore_version() -> str:
    # Read from the source, as the spec does; a regex on the file keeps MLX out of this test.
    text = (ROOT / "kvcore" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', text, re.MULTILINE)
    assert match, "kvcore/__init__.py has no __version__"
    return match.group(1)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR", f"{path}: first chunk is not IHDR"
    return struct.unpack(">II", data[16:24])


def spec_constants() -> dict[str, object]:
    tree = ast.parse(SPEC.read_text(encoding="utf-8"), filename=str(SPEC))
    constants: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper():
                with contextlib.suppress(ValueError):  # computed at build time (ROOT, VERSION): skipped
                    constants[name] = ast.literal_eval(node.value)
    return constants


def load_plist(path: Path) -> dict:
    with path.open("rb") as fh:
        return plistlib.load(fh)


def test_spec_compiles_as_python():
    compile(SPEC.read_text(encoding="utf-8"), str(SPEC), "exec")


def test_spec_declares_what_the_bundle_needs():
    c = spec_constants()
    assert c["BUNDLE_ID"] == "org.kvlens.KVLens"
    assert c["APP_NAME"] == "KV Lens"
    dests = {dest for _src, dest in c["RESOURCES"]}
    assert {"resources/models/kvlens-demo", "resources/prompts", "resources/icons"} <= dests
    for must_exclude in ("tests", "pytest", "PyQt5", "PyQt6", "PySide6.QtQml", "PySide6.QtWebEngineCore"):
        assert must_exclude in c["EXCLUDES"], must_exclude
    text = SPEC.read_text(encoding="utf-8")
    # The parts of the spec that are calls, not constants: checked as text so the spec need not run.
    for needle in (
        'collect_submodules("mlx")',
        'collect_submodules("mlx_lm.models")',
        'collect_dynamic_libs("mlx")',
        'collect_data_files("mlx")',
        'target_arch="arm64"',
        "console=False",
        "exclude_binaries=True",
        "BUNDLE(",
    ):
        assert needle in text, needle


def test_spec_file_inputs_exist():
    c = spec_constants()
    for key in ("ENTRY_SCRIPT", "ICON", "INFO_PLIST"):
        assert (ROOT / c[key]).is_file(), f"{key} = {c[key]} does not exist"
    for hook in c["RUNTIME_HOOKS"]:
        assert (ROOT / hook).is_file(), hook
        compile((ROOT / hook).read_text(encoding="utf-8"), hook, "exec")


def has_files(path: Path) -> bool:
    return path.is_dir() and any(p.is_file() for p in path.rglob("*"))


@pytest.mark.parametrize("src", [src for src, _dest in spec_constants()["RESOURCES"]])
def test_spec_resource_folders_exist(src):
    path = ROOT / src
    assert has_files(path), f"{src} is bundled by kvlens.spec but is missing or empty"


def test_info_plist_keys_and_version():
    info = load_plist(PACKAGING / "Info.plist")
    version = kvcore_version()
    assert info["CFBundleShortVersionString"] == version
    assert info["CFBundleVersion"] == version
    assert info["CFBundleName"] == "KV Lens"
    assert info["CFBundleIdentifier"] == spec_constants()["BUNDLE_ID"]
    assert info["NSHighResolutionCapable"] is True
    assert info["NSRequiresAquaSystemAppearance"] is False
    # MLX wheels need macOS 14.0+; an app claiming less would install and then fail to load MLX.
    assert tuple(int(x) for x in info["LSMinimumSystemVersion"].split(".")) >= (14, 0)


def test_entitlements_plist_parses_and_grants_nothing_unexplained():
    ent = load_plist(PACKAGING / "entitlements.plist")
    assert isinstance(ent, dict)
    text = (PACKAGING / "entitlements.plist").read_text(encoding="utf-8")
    for key, value in ent.items():
        assert value is True, f"{key}: only true entitlements belong in the file (Apple's convention)"
        # Each granted exception must be explained in the file's comment (by its key, outside the dict).
        assert text.count(key) >= 2, f"{key} is granted without a comment saying why"
    for dangerous in (
        "com.apple.security.get-task-allow",
        "com.apple.security.cs.disable-executable-page-protection",
    ):
        assert dangerous not in ent, dangerous


def test_icon_png_is_1024_square():
    assert png_size(ROOT / "resources" / "icons" / "kvlens.png") == (1024, 1024)


def test_icon_svg_is_an_svg_document():
    import xml.etree.ElementTree as ET

    root = ET.parse(ROOT / "resources" / "icons" / "kvlens.svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("viewBox") == "0 0 1024 1024"


def test_iconset_has_exactly_the_sizes_iconutil_expects():
    names = {p.name for p in ICONSET.iterdir()}
    assert names == set(EXPECTED_ICONSET)
    for name, size in EXPECTED_ICONSET.items():
        assert png_size(ICONSET / name) == (size, size), name


def test_icns_chunks_are_pngs_of_the_declared_sizes():
    data = (PACKAGING / "KVLens.icns").read_bytes()
    assert data[:4] == b"icns"
    assert struct.unpack(">I", data[4:8])[0] == len(data)
    seen = {}
    offset = 8
    while offset < len(data):
        kind = data[offset : offset + 4]
        length = struct.unpack(">I", data[offset + 4 : offset + 8])[0]
        assert length > 8 and offset + length <= len(data), f"bad chunk length for {kind!r}"
        payload = data[offset + 8 : offset + length]
        assert payload[:8] == b"\x89PNG\r\n\x1a\n", f"{kind!r} is not PNG data"
        seen[kind] = struct.unpack(">II", payload[16:24])
        offset += length
    assert seen == {kind: (size, size) for kind, size in ICNS_SIZES.items()}


def test_make_icons_sizes_match_this_test():
    # make_icons.py and this test each list the sizes; a change to one without the other fails here.
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_icons", PACKAGING / "make_icons.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # module level only defines constants and functions (no Qt import)
    assert module.ICONSET_SIZES == EXPECTED_ICONSET
    assert {k: v[0] for k, v in module.ICNS_TYPES.items()} == ICNS_SIZES
