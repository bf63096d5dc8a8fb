"""One key, one value, asked for it (RULER niah_single)."""

from functools import partial

from kvcore.probes.ruler import niah
from kvcore.probes.ruler.base import Task

TASK = Task(
    name="niah_single",
    metric="all",
    build=partial(niah.build, n_keys=1, n_values=1, n_queries=1),
    description="one key, one value, asked for it (RULER niah_single)",
)
