"""`kvlens probe`: needle recall over methods × ratios × depths × lengths, one prefill per prompt.

  kvlens probe --methods snapkv,streaming_llm --ratios 0.25,0.5 --depths 0.1,0.5,0.9 --lengths 800,1600 \\
      --families yaml_key,xml_param --seeds 3 --csv probes.csv

Progress goes to stderr; the summary (recall per configuration) to stdout; `--csv` has one row per
(probe, configuration), the dense cache's row included (method "dense"), and with `--control` the dense cache on
the prompt without its needle (method "no_needle": what is recalled with no needle is guessed, so a method's
recall is read against it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvcore.defaults import (
    DEFAULT_PROBE_DEPTHS,
    DEFAULT_PROBE_LENGTHS,
    DEFAULT_PROBE_METHODS,
    DEFAULT_PROBE_RATIOS,
    UNQUANTIZED_BITS,
)


def add_arguments(s: argparse.ArgumentParser) -> None:
    """The probe-only options (the shared model / compression options are added by kvcore.cli.main)."""
    from kvcore.probes import HELDOUT_FAMILIES

    s.add_argument("--methods", default=",".join(DEFAULT_PROBE_METHODS))
    s.add_argument("--ratios", default=",".join(map(str, DEFAULT_PROBE_RATIOS)))
    s.add_argument(
        "--bits", default=str(UNQUANTIZED_BITS), help="comma-separated, e.g. 4,16 (16 = unquantized)"
    )
    s.add_argument(
        "--depths", default=",".join(map(str, DEFAULT_PROBE_DEPTHS)), help="needle depths in [0, 1]"
    )
    s.add_argument(
        "--lengths", default=",".join(map(str, DEFAULT_PROBE_LENGTHS)), help="prompt lengths in tokens"
    )
    s.add_argument(
        "--families",
        default=",".join(HELDOUT_FAMILIES),
        help="probe template families (default: the held-out ones; see kvcore/probes/families/)",
    )
    s.add_argument("--seeds", type=int, default=1, help="prompts per (depth, length, family) cell")
    s.add_argument("--seed", type=int, default=0, help="first seed")
    s.add_argument("--csv", type=Path, help="one row per (probe, configuration), the dense cache's included")
    s.add_argument(
        "--control",
        action="store_true",
        help="also prefill each prompt without its needle (method no_needle): recall that needs no needle",
    )
    s.add_argument(
        "--query-aware",
        action="store_true",
        help="with a --prompts set of contexts and questions: prefill and compress context and question together "
        "(default: the context alone, the question appended after compression, as kvpress evaluates)",
    )


def score_probes(
    session: Any, specs: list[dict[str, Any]], configs: list[Any], control: bool = False
) -> list[dict[str, Any]]:
    """Build, prefill and score every probe (with `control`, each also without its needle); progress on stderr."""
    from kvcore.probes import make_probe
    from kvcore.probes.scoring import probe_rows

    ctx = session.info.max_context
    rows: list[dict[str, Any]] = []
    for i, spec in enumerate(specs):
        probe = make_probe(session.tokenizer, **spec)
        if ctx is not None and len(session.encode(probe.prompt)) + probe.max_new_tokens > ctx:
            raise ValueError(f"--lengths {spec['n_tokens']} does not fit the model's context of {ctx} tokens")
        rows.extend(probe_rows(session, probe, configs, control=control))
        sys.stderr.write(
            f"\rprobe {i + 1}/{len(specs)}: {spec['family']} depth={spec['depth']:g} "
            f"length={spec['n_tokens']} ({len(configs)} configurations{', no-needle control' if control else ''})   "
        )
        sys.stderr.flush()
    sys.stderr.write("\n")
    return rows


def print_summary(rows: list[dict[str, Any]]) -> None:
    from kvcore.probes.scoring import recall_table

    for (method, schedule, ratio, key_bits, value_bits, fp_recent), recall in recall_table(rows).items():
        bits = key_bits if key_bits == value_bits else f"K{key_bits}/V{value_bits}"
        bits = f"{bits} fp{fp_recent}" if fp_recent else bits
        label = method if not schedule else f"{method} r={ratio:g} bits={bits} ({schedule})"
        print(f"{label:>44}: recall {recall:.2f}")
