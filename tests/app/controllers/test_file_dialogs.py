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
