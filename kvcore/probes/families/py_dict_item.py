"""An item stored in a settings dict, read back (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="py_dict_item",
    bind='SETTINGS["{name}"] = "{value}"\n',
    ask='\nexpected = SETTINGS["{name}"]\nassert expected == "',
    held_out=False,
    style="snake",
    values="alnum",
)
