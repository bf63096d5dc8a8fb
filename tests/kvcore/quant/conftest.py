"""A folder on kvcore.quant's package path, where a scheme file written is a module of the package."""

from __future__ import annotations

import pytest

from tests.conftest import package_folder


@pytest.fixture
def scheme_folder(tmp_path, monkeypatch):
    """A folder whose scheme files are schemes of kvcore.quant (tests/conftest.py's package_folder)."""
    from kvcore import quant

    yield from package_folder(quant, tmp_path, monkeypatch)
