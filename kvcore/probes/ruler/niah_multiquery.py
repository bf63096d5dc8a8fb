"""Four keys, all four asked at once (RULER niah_multiquery)."""

from functools import partial

from kvcore.probes.ruler import niah
from kvcore.probes.ruler.base import Task

TASK = Task(
    name="niah_multiquery",
    metric="all",
    build=partial(niah.build, n_keys=niah.N_NEEDLES, n_values=1, n_queries=niah.N_NEEDLES),
    description="four keys, all four asked at once (RULER niah_multiquery)",
)
