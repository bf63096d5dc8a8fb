"""A file dialog opens in the folder the same kind of dialog last chose; other kinds keep theirs."""

from __future__ import annotations

from PySide6.QtWidgets import QFileDialog, QWidget

from app.controllers import file_dialogs
from app.settings import Settings


def test_save_dialogs_start_where_their_kind_last_saved(qapp, tmp_path, monkeypatch):
    starts: list[str] = []
    answers = iter([str(tmp_path / "a" / "one.csv"), str(tmp_path / "b" / "two.csv")])
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()

    def dialog(parent, title, start, filters):  # noqa: ANN001 (QFileDialog's signature)
        starts.append(start)
        return next(answers, ""), filters

    monkeypatch.setattr(QFileDialog, "getSaveFileName", dialog)
    settings, parent = Settings(), QWidget()
    kinds = (file_dialogs.STATS, file_dialogs.SWEEPS, file_dialogs.STATS, file_dialogs.SWEEPS)
    for kind in kinds:
        file_dialogs.save_path(parent, settings, kind, "Export", "x.csv", "CSV (*.csv)")
    assert starts == ["x.csv", "x.csv", str(tmp_path / "a" / "x.csv"), str(tmp_path / "b" / "x.csv")]


def test_session_dialogs_open_where_a_session_was_last_chosen(qapp, model_dirs, tmp_path, monkeypatch):
    from app.window.main_window import MainWindow

    starts: list[str] = []
    folder = tmp_path / "sessions"
    folder.mkdir()

    def dialog(parent, title, start, filters):  # noqa: ANN001 (QFileDialog's signature)
        starts.append(start)
        return "", ""

    monkeypatch.setattr(QFileDialog, "getOpenFileName", dialog)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", dialog)
    window = MainWindow(model=str(model_dirs["llama"]), settings_path=tmp_path / "s.json")
    try:
        window.settings.remember_folder(file_dialogs.SESSIONS, str(folder / "old.kvlens"))
        window.session_files.open_dialog()
        window.session_files.save_dialog()
        assert starts == [str(folder), str(folder / "session.kvlens")]
    finally:
        window.close()
