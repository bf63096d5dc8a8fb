"""show_hover: the text becomes the widget's tooltip; an empty text clears the last one."""

from PySide6.QtWidgets import QLabel

from app.widgets.hover import show_hover


def test_show_hover_sets_and_clears_the_tooltip(qtbot):
    widget = QLabel("plot")
    qtbot.addWidget(widget)
    show_hover(widget, "L1 h0 · position 65")
    assert widget.toolTip() == "L1 h0 · position 65"
    show_hover(widget, "")
    assert widget.toolTip() == ""
