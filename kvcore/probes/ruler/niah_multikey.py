"""Four keys, one asked; the others distract (RULER niah_multikey)."""

from functools import partial

from kvcore.probes.ruler import niah
from kvcore.probes.ruler.base import Task

TASK = Task(
    name="niah_multikey",
    metric="all",
    build=partial(niah.build, n_keys=niah.N_NEEDLES, n_values=1, n_queries=1),
    description="four keys, one asked; the others distract (RULER niah_multikey)",
)
