"""The needle-in-a-haystack grid: depth × length probes of one family and seed, each prefilled once and scored
for the dense cache and every configuration (kvcore.probes.scoring), yielded cell by cell as each finishes.

A cell is exactly what `kvlens probe` computes for the same family, seed, depth, length and configurations (the
same `make_probe` and `probe_rows`), so the app's grid and the CLI's CSV agree row for row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvcore.capture.prefill import Cancelled
from kvcore.probes import Probe, make_probe
from kvcore.probes.plan import plan_from_text
from kvcore.probes.scoring import probe_rows

__all__ = ["GridCell", "grid_specs", "run_grid"]


@dataclass(frozen=True)
class GridCell:
    """One (depth, length) probe: its prompt and one row per cache — the dense one first, then each config."""

    index: int
    probe: Probe
    rows: list[dict[str, Any]]

    @property
    def recalled(self) -> list[bool]:
        return [bool(r["recalled"]) for r in self.rows]


def _split(text: str, kind: type, name: str) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{name} {text!r}: expected comma-separated {kind.__name__} values") from None
    if not values:
        raise ValueError(f"no {name} given")
    return values


def grid_specs(family: str, seed: int, depths: str, lengths: str) -> list[dict[str, Any]]:
    """The probes of a grid (lengths outer, depths inner, as `kvlens probe` orders them); ValueError names the
    bad value and the fix (the same checks as `kvlens probe`)."""
    specs = plan_from_text(family, depths, lengths, seeds=1, seed=seed, split=_split)
    return [{k: s[k] for k in ("family", "seed", "depth", "n_tokens")} for s in specs]


def run_grid(
    session: Any,
    specs: Sequence[dict[str, Any]],
    configs: Sequence[Any],
    should_cancel: Callable[[], bool] | None = None,
) -> Iterator[GridCell]:
    """Prefill each probe once on `session` and yield its cell; stops (without raising) when cancelled, keeping
    the cells already yielded. The session's own prefill is replaced, so give it a session of its own."""
    ctx = session.info.max_context
    for i, spec in enumerate(specs):
        if should_cancel is not None and should_cancel():
            return
        probe = make_probe(session.tokenizer, **spec)
        if ctx is not None and len(session.encode(probe.prompt)) + probe.max_new_tokens > ctx:
            raise ValueError(f"length {spec['n_tokens']} does not fit the model's context of {ctx} tokens")
        try:
            rows = probe_rows(session, probe, configs, should_cancel=should_cancel)
        except Cancelled:
            return
        yield GridCell(i, probe, rows)
