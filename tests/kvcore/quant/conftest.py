"""A folder on kvcore.quant's package path, where a scheme file written is a module of the package."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture
def scheme_folder(tmp_path, monkeypatch):
    """As tests/conftest.py's method_folder, for kvcore.quant: discovery is cleared before and after, so no other
    test sees a scheme written there."""
    from kvcore import quant

    folder = tmp_path / "more_schemes"
    folder.mkdir()
    monkeypatch.setattr(quant, "__path__", [*quant.__path__, str(folder)])
    quant._classes.cache_clear()
    quant.available.cache_clear()
    yield folder
    monkeypatch.undo()
    stems = {p.stem for p in folder.glob("*.py")}
    for name in [m for m in sys.modules if m.startswith("kvcore.quant.") and m.rsplit(".", 1)[1] in stems]:
        del sys.modules[name]
    quant._classes.cache_clear()
    quant.available.cache_clear()
