"""A row inserted with sql and selected back (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="sql_insert",
    bind="cursor.execute(\"INSERT INTO settings VALUES ('{name}', '{value}')\")\n",
    ask="\nrow = cursor.execute(\"SELECT value FROM settings WHERE key = '{name}'\").fetchone()\nassert row[0] == '",
    held_out=False,
    style="snake",
    values="alnum",
)
