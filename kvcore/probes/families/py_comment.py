"""A value noted in a comment, restated later (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="py_comment",
    bind="# {name}: {value}\n",
    ask="\n# {name}:",
    held_out=False,
    style="snake",
    values="alnum",
)
