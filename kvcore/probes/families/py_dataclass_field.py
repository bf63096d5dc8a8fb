"""A dataclass field default (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="py_dataclass_field",
    bind='@dataclass\nclass Options:\n    {name}: str = "{value}"\n',
    ask='\n# Options() defaults: {name}: str = "',
    held_out=False,
    style="snake",
    values="alnum",
)
