"""The `kvlens` subcommands: argument parsing and printing only."""
