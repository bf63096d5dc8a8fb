"""An attribute set with setattr and read with getattr (held-out family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="setattr_call",
    bind='setattr(config, "{name}", "{value}")\n',
    ask='\nassert getattr(config, "{name}") == "',
    held_out=True,
    style="snake",
    values="alnum",
)
