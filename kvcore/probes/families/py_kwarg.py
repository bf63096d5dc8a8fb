"""A keyword argument repeated in a second call (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="py_kwarg",
    bind='client = connect(timeout=30, {name}="{value}")\n',
    ask='\n# reconnect with the same credentials\nclient = connect(timeout=30, {name}="',
    held_out=False,
    style="snake",
    values="alnum",
)
