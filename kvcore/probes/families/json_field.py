"""A field of a json payload (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="json_field",
    bind='    "{name}": "{value}",\n',
    ask='\nassert payload["{name}"] == "',
    held_out=False,
    style="snake",
    values="alnum",
)
