"""Where the bundled demo model and sample prompts live (beside the packages, or inside an app bundle)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def resources_dir() -> Path:
    """`resources/` of the checkout, of a PyInstaller bundle, or KVLENS_RESOURCES when set."""
    if os.environ.get("KVLENS_RESOURCES"):
        return Path(os.environ["KVLENS_RESOURCES"])
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        return Path(bundle) / "resources"
    return Path(__file__).resolve().parent.parent / "resources"


def demo_model_dir() -> Path:
    return resources_dir() / "models" / "kvlens-demo"


def prompts_dir() -> Path:
    return resources_dir() / "prompts"
