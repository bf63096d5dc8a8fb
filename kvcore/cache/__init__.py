"""Caches that keep a subset of positions per layer and kv-head, and their files."""
