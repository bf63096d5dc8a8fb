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
