"""show_hover: the text becomes the widget's tooltip; an empty text clears the last one."""

from PySide6.QtWidgets import QLabel

from app.widgets.hover import HoverLine, show_hover


def test_show_hover_sets_and_clears_the_tooltip(qtbot):
    widget = QLabel("plot")
    qtbot.addWidget(widget)
    show_hover(widget, "L1 h0 · position 65")
    assert widget.toolTip() == "L1 h0 · position 65"
    show_hover(widget, "")
    assert widget.toolTip() == ""


def test_the_hover_line_repeats_the_text_and_falls_back_to_its_hint(qtbot):
    graphics = QLabel("plot")
    line = HoverLine("Hover a cell", "someHover")
    qtbot.addWidget(graphics)
    qtbot.addWidget(line)
    line.show_text(graphics, "L0 h1 · channel 3")
    assert line.text() == graphics.toolTip() == "L0 h1 · channel 3"
    line.show_text(graphics, "")
    assert line.text() == "Hover a cell" and graphics.toolTip() == ""
