"""`kvlens`: no arguments (or --model) opens the window; subcommands go to kvcore.cli.main without importing Qt."""

from __future__ import annotations

import argparse
import sys

from kvcore import __version__


def _write_frontier(points, path, metric) -> None:  # noqa: ANN001 (kvcore.cli.main.PlotWriter)
    """`sweep --plot`: imports Qt only now, so every other subcommand stays Qt-free."""
    from app.frontier_export import write_frontier

    write_frontier(points, path, metric)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-"):
        from kvcore.cli.main import main as cli_main

        return cli_main(argv, plot_writer=_write_frontier)
    parser = argparse.ArgumentParser(prog="kvlens", description="KV Lens: see KV-cache compression.")
    parser.add_argument("--version", action="version", version=f"kvlens {__version__}")
    parser.add_argument("--model", help="model folder or Hugging Face repo id (default: bundled demo)")
    args = parser.parse_args(argv)
    from app.gui import run_gui

    return run_gui(model=args.model)


if __name__ == "__main__":
    sys.exit(main())
