"""A javascript const compared later (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="camel_js",
    bind="const {name} = '{value}';\n",
    ask="\nconsole.assert({name} === '",
    held_out=False,
    style="camel",
    values="alnum",
)
