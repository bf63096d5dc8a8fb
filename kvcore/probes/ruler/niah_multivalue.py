"""One key bound to four values, all asked (RULER niah_multivalue)."""

from functools import partial

from kvcore.probes.ruler import niah
from kvcore.probes.ruler.base import Task

TASK = Task(
    name="niah_multivalue",
    metric="all",
    build=partial(niah.build, n_keys=1, n_values=niah.N_NEEDLES, n_queries=1),
    description="one key bound to four values, all asked (RULER niah_multivalue)",
)
