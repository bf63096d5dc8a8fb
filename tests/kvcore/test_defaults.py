"""`bits_or_none`: the one place 16 (the UI's and CLI's "unquantized") becomes the engine's None."""

from kvcore.defaults import ALLOWED_BITS, UNQUANTIZED_BITS, bits_or_none


def test_unquantized_is_none_and_packed_widths_stay():
    assert bits_or_none(UNQUANTIZED_BITS) is None and bits_or_none(None) is None
    assert [bits_or_none(b) for b in ALLOWED_BITS] == list(ALLOWED_BITS)
