"""The work of a prompt set in lock-step rounds over one or several ranks, merged after every round.

Work is (prompt, configuration) pairs; a *job* is one prompt with the configurations it still needs (one prefill,
then recompress + regenerate each). Jobs are sharded deterministically, balanced by token count (longest first
onto the least-loaded rank), so every rank computes the same plan with no message. Ranks then go in lock-step
rounds — each runs its next job, then all gather the encoded rows (JSON of CSV cells) — so rank 0, which alone
writes, can rewrite the file after every round: an interrupted run keeps all finished rounds for `--resume`.
A job that raises is reported by prompt id; its finished configurations are kept and the other jobs go on.

Rows travel as the text cells of the CSV (kvcore.sets.records) and are merged in (prompt, configuration) order, so
a single-process, a distributed and a resumed run of the same work write the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcore.sets.ranks import Ranks
from kvcore.sets.records import Records

#: What a job yields: (configuration index, its encoded rows) as each configuration finishes.
Evaluate = Callable[["Job"], Iterator[tuple[int, Records]]]


@dataclass(frozen=True)
class Job:
    """One prompt (index into the set) and the configuration indices it still has to run."""

    prompt: int
    configs: tuple[int, ...]
    weight: int = 1  # prompt tokens × (configurations + 1): the prefill plus one decode per configuration


@dataclass
class SetResults:
    """Finished rows by (prompt, configuration) and failures by prompt, merged from every rank."""

    rows: dict[tuple[int, int], Records] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)

    def records(self) -> Records:
        """Every row in (prompt, configuration) order: the file's order whatever order the work finished in."""
        return [r for key in sorted(self.rows) for r in self.rows[key]]


def balanced_shards(jobs: Sequence[Job], size: int) -> list[list[Job]]:
    """Jobs per rank: heaviest first onto the least-loaded rank (ties: lower prompt, lower rank), each rank's
    list in prompt order. Deterministic, so every rank computes the same plan."""
    loads = [0] * size
    shards: list[list[Job]] = [[] for _ in range(size)]
    for job in sorted(jobs, key=lambda j: (-j.weight, j.prompt)):
        rank = min(range(size), key=lambda r: (loads[r], r))
        shards[rank].append(job)
        loads[rank] += job.weight
    return [sorted(s, key=lambda j: j.prompt) for s in shards]


def run_rounds(
    jobs: Sequence[Job],
    evaluate: Evaluate,
    ranks: Ranks,
    results: SetResults,
    describe: Callable[[int], str],
    on_round: Callable[[SetResults], None] | None = None,
) -> SetResults:
    """Run this rank's shard in lock-step rounds, merging every rank's rows into `results` after each round.

    `describe(prompt)` names a prompt in an error. `on_round` (rank 0 writes the file there) runs after every
    round on every rank, with the merged results so far.
    """
    shards = balanced_shards(jobs, ranks.size)
    mine = shards[ranks.rank]
    for r in range(max((len(s) for s in shards), default=0)):
        payload: dict[str, Any] = {"rows": [], "errors": []}
        if r < len(mine):
            job = mine[r]
            try:
                for config, records in evaluate(job):
                    payload["rows"].append([job.prompt, config, records])
            except Exception as exc:  # a bad prompt or an out-of-memory: named, the other jobs go on
                payload["errors"].append([job.prompt, f"prompt {describe(job.prompt)}: {exc}"])
        for got in ranks.gather_json(payload):
            for prompt, config, records in got["rows"]:
                results.rows[prompt, config] = records
            for prompt, message in got["errors"]:
                results.errors[prompt] = message
        if on_round is not None:
            on_round(results)
    return results
