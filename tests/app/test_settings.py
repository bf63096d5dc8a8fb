"""Settings round-trip, recent-model order and the corrupt-file fallback."""

from __future__ import annotations

import json
import sys

from app.settings import MAX_RECENT, Settings


def test_missing_file_gives_defaults_without_warning(tmp_path):
    settings, warning = Settings.load(tmp_path / "none.json")
    assert warning is None
    assert settings == Settings()


def test_round_trip(tmp_path):
    path = tmp_path / "sub" / "settings.json"
    s = Settings(geometry="AdnQywAD", last_prompt="def f():", last_method="h2o", last_ratio=0.4, last_bits=8)
    s.last_value_bits = 4
    s.add_recent_model("/models/a")
    assert s.save(path) is None
    loaded, warning = Settings.load(path)
    assert warning is None
    assert loaded == s
    assert (loaded.last_bits, loaded.last_value_bits) == (8, 4) and loaded.recent_models == ["/models/a"]
    assert not [p for p in path.parent.iterdir() if p.name != "settings.json"], "temp file left behind"


def test_recent_models_most_recent_first_capped():
    s = Settings()
    for i in range(MAX_RECENT + 5):
        s.add_recent_model(f"m{i}")
    s.add_recent_model("m7")
    assert s.recent_models[0] == "m7"
    assert len(s.recent_models) == MAX_RECENT
    assert s.recent_models.count("m7") == 1
    assert s.recent_models[1] == f"m{MAX_RECENT + 4}"


def test_corrupt_file_falls_back_with_warning(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{ not json", encoding="utf-8")
    settings, warning = Settings.load(path)
    assert settings == Settings()
    assert warning and "corrupt" in warning


def test_invalid_fields_fall_back_individually(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"last_ratio": "lots", "last_prompt": "hi", "recent_models": [1, 2]}))
    settings, warning = Settings.load(path)
    assert settings.last_prompt == "hi"
    assert settings.last_ratio == Settings().last_ratio
    assert settings.recent_models == []
    assert "last_ratio" in warning and "recent_models" in warning


def test_non_object_and_binary_files(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("[1, 2]")
    assert Settings.load(path)[1] is not None
    path.write_bytes(b"\xff\xfe\x00garbage")
    settings, warning = Settings.load(path)
    assert settings == Settings() and warning


def test_save_to_unwritable_folder_returns_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    warning = Settings().save(blocker / "settings.json")
    assert warning and "Could not save" in warning


def test_default_path_is_in_config_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    from app.settings import default_path

    if sys.platform.startswith("linux"):
        assert str(default_path()).startswith(str(tmp_path))
    assert default_path().name == "settings.json"


def test_chat_template_fields_are_type_checked(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"chat_template": False, "system_prompt": "Be brief."}))
    assert Settings.load(path) == (Settings(chat_template=False, system_prompt="Be brief.", path=path), None)
    path.write_text(json.dumps({"chat_template": "yes", "system_prompt": 3}))
    settings, warning = Settings.load(path)
    assert settings.chat_template is True and settings.system_prompt == ""
    assert "chat_template" in warning and "system_prompt" in warning


def test_recent_sessions_are_checked_and_kept_in_order(tmp_path):
    from app.settings import MAX_RECENT, Settings

    path = tmp_path / "settings.json"
    path.write_text('{"recent_sessions": [3, "a.kvlens"]}')
    settings, warning = Settings.load(path)
    assert settings.recent_sessions == [] and "recent_sessions" in warning
    for i in range(MAX_RECENT + 2):
        settings.add_recent_session(f"{i}.kvlens")
    settings.add_recent_session("3.kvlens")
    assert settings.recent_sessions[:2] == ["3.kvlens", f"{MAX_RECENT + 1}.kvlens"]
    assert len(settings.recent_sessions) == MAX_RECENT
    assert settings.save() is None and Settings.load(path)[0].recent_sessions == settings.recent_sessions


def test_each_kind_of_dialog_remembers_its_own_folder(tmp_path):
    stats, images = tmp_path / "stats", tmp_path / "images"
    stats.mkdir(), images.mkdir()
    s = Settings()
    assert s.folder_for("stats") == ""
    s.remember_folder("stats", stats / "kvlens_stats.csv")
    s.remember_folder("images", images)
    path = tmp_path / "settings.json"
    assert s.save(path) is None
    loaded, warning = Settings.load(path)
    assert warning is None
    assert (loaded.folder_for("stats"), loaded.folder_for("images")) == (str(stats), str(images))
    stats.rmdir()
    assert loaded.folder_for("stats") == "", "a folder that is gone is not offered"


def test_bad_last_folders_fall_back_with_a_warning(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"last_folders": {"stats": 3}}), encoding="utf-8")
    loaded, warning = Settings.load(path)
    assert loaded.last_folders == {} and "last_folders" in warning
