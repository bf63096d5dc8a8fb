"""A default argument returned by the function (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="func_default",
    bind="def configure({name}={value}):\n    return {name}\n",
    ask="\n# configure() returns its default {name}=",
    held_out=False,
    style="snake",
    values="digits",
)
