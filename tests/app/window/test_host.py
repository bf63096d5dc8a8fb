"""The window is what its controllers and menus were promised: every member of the Host and MenuOwner protocols."""

from __future__ import annotations

from app.controllers.host import Host
from app.window.main_window import MainWindow
from app.window.parts import MenuOwner


def _members(protocol: type) -> set[str]:
    return set(protocol.__annotations__) | {name for name in vars(protocol) if not name.startswith("_")}


def test_the_window_has_every_member_its_protocols_declare(qapp, tmp_path):
    window = MainWindow(model=None, settings_path=tmp_path / "settings.json")
    try:
        for protocol in (Host, MenuOwner):
            members = _members(protocol)
            assert len(members) > 10
            missing = sorted(name for name in members if not hasattr(window, name))
            assert not missing, f"MainWindow lacks {protocol.__name__} members {missing}"
        assert window.widget is window
    finally:
        window.shut_down()
