"""Needle grid runner: the probes `kvlens probe` would build, one prefill each, cancel keeps finished cells."""

import pytest

from kvcore.engine.session import CompressionConfig, Session
from kvcore.probes import make_probe
from kvcore.probes.needle_grid import grid_specs, run_grid


def test_specs_are_lengths_by_depths_and_bad_input_names_the_fix():
    specs = grid_specs("yaml_key", 4, "0.1,0.9", "96,128")
    assert [(s["n_tokens"], s["depth"]) for s in specs] == [(96, 0.1), (96, 0.9), (128, 0.1), (128, 0.9)]
    assert {s["seed"] for s in specs} == {4}
    for args, message in [
        (("nope", 0, "0.5", "96"), "unknown nope"),
        (("yaml_key", 0, "1.5", "96"), "between 0 and 1"),
        (("yaml_key", 0, "0.5", "32"), "at least 64"),
        (("yaml_key", 0, "x", "96"), "comma-separated float"),
    ]:
        with pytest.raises(ValueError, match=message):
            grid_specs(*args)


def test_cells_follow_the_specs_and_cancel_keeps_the_finished_ones(model_dirs):
    session = Session.load(str(model_dirs["llama"]))
    specs = grid_specs("yaml_key", 0, "0.2,0.8", "96")
    configs = [CompressionConfig("snapkv", 0.5, window=16)]
    cells = list(run_grid(session, specs, configs))
    assert [c.index for c in cells] == [0, 1]
    for cell, spec in zip(cells, specs, strict=True):
        assert cell.probe == make_probe(session.tokenizer, **spec)
        assert [r["method"] for r in cell.rows] == ["dense", "snapkv"]
        assert cell.recalled == [cell.probe.recalled(r["continuation"]) for r in cell.rows]
    kept = []
    for cell in run_grid(session, specs, configs, should_cancel=lambda: len(kept) >= 1):
        kept.append(cell)
    assert [c.index for c in kept] == [0] and kept[0].rows == cells[0].rows


def test_the_default_grid_is_recalled_whole_by_the_dense_cache_on_the_demo_model():
    """The Needle dock's defaults: every miss in the grid is the method's (argparse_default missed 4 of 6 cells
    dense), and the grid still tells a query-aware method from a recency window."""
    from kvcore.defaults import (
        DEFAULT_PROBE_DEPTHS,
        DEFAULT_PROBE_FAMILY,
        DEFAULT_PROBE_LENGTHS,
        DEFAULT_PROBE_SEED,
    )
    from kvcore.probes import HELDOUT_FAMILIES
    from kvcore.resources import demo_model_dir

    assert DEFAULT_PROBE_FAMILY in HELDOUT_FAMILIES
    session = Session.load(str(demo_model_dir()))
    depths, lengths = (",".join(map(str, v)) for v in (DEFAULT_PROBE_DEPTHS, DEFAULT_PROBE_LENGTHS))
    specs = grid_specs(DEFAULT_PROBE_FAMILY, DEFAULT_PROBE_SEED, depths, lengths)
    configs = [CompressionConfig("snapkv", 0.25), CompressionConfig("streaming_llm", 0.25)]
    cells = list(run_grid(session, specs, configs))
    assert len(cells) == len(DEFAULT_PROBE_DEPTHS) * len(DEFAULT_PROBE_LENGTHS)
    dense, snapkv, streaming = ([c.recalled[i] for c in cells] for i in range(3))
    assert all(dense), [(c.probe.depth, c.probe.n_tokens) for c in cells if not c.recalled[0]]
    assert all(snapkv) and 0 < sum(streaming) < len(cells), (snapkv, streaming)
