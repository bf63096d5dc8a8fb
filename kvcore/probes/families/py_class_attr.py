"""A class attribute asserted in a test (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="py_class_attr",
    bind='class Defaults:\n    {name} = "{value}"\n',
    ask='\n\ndef test_defaults():\n    assert Defaults.{name} == "',
    held_out=False,
    style="snake",
    values="word",
)
