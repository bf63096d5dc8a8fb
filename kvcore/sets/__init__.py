"""Prompt sets run over configurations on one or many ranks, their summaries and results files."""
