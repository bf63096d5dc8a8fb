"""Headless subcommands (placeholder until the methods issue lands)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    print(f"kvlens: unknown command '{argv[0]}'", file=sys.stderr)
    return 2
