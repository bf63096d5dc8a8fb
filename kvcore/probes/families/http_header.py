"""An HTTP response header, unquoted where it is set and quoted where it is checked (held-out family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="http_header",
    bind="X-{name}: {value}\n",
    ask='\nassert response.headers["X-{name}"] == "',
    held_out=True,
    style="kebab",
    values="alnum",
)
