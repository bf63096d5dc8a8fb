"""Tick labels say the value itself: no SI prefix, scientific notation only where plain digits would be long."""

from __future__ import annotations

from app.widgets.axes import ScientificAxis, tick_text


def test_tick_text_reads_plainly_and_goes_scientific_for_small_and_large_values():
    assert [tick_text(v, 0.1) for v in (0.0, 0.1, 0.30000000000000004, 1.0)] == ["0", "0.1", "0.3", "1"]
    assert tick_text(2e-5, 1e-5) == "2e-5"
    assert tick_text(1_200_000.0, 200_000.0) == "1.2e6"
    assert tick_text(0.1234, 0.0001) == "0.1234", "enough digits to tell close ticks apart"


def test_the_axis_never_scales_by_an_si_prefix(qapp):
    axis = ScientificAxis("left")
    axis.setLabel("KL")
    axis.setRange(0, 0.0004)
    assert not axis.autoSIPrefix and axis.labelUnitPrefix == ""
    assert axis.tickStrings([0.0001, 0.0002], 1.0, 0.0001) == ["0.0001", "0.0002"]
