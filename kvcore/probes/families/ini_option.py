"""An ini option, read back (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="ini_option",
    bind="[service]\n{name} = {value}\n",
    ask='\nparser.read_string("[service]\\n{name} =',
    held_out=False,
    style="snake",
    values="digits",
)
