"""A row of a markdown table in a docstring (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="md_table_row",
    bind="| {name} | {value} |\n",
    ask="\n| {name} |",
    held_out=False,
    style="kebab",
    values="word",
)
