"""A module-level string constant, checked by an assert (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="py_assign",
    bind='{name} = "{value}"\n',
    ask='\n# the value configured above\nassert {name} == "',
    held_out=False,
    style="snake",
    values="alnum",
)
