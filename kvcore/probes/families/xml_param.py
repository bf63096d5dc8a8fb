"""An xml attribute looked up by its name (held-out family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="xml_param",
    bind='TEMPLATE = \'<param name="{name}" value="{value}"/>\'\n',
    ask='\nassert TEMPLATE == \'<param name="{name}" value="',
    held_out=True,
    style="snake",
    values="alnum",
)
