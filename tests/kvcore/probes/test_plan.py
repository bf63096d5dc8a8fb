"""The probe planner: typed values in, probes in `kvlens probe`'s order out; the first bad option named."""

import pytest

from kvcore.probes.plan import plan_from_text, plan_probes


def _split(text, kind, name):
    return [kind(v) for v in text.split(",")]


def test_probes_go_families_then_lengths_then_depths_then_seeds():
    specs = plan_probes(["yaml_key", "xml_param"], [0.1, 0.9], [96, 128], seeds=2, seed=5)
    assert len(specs) == 2 * 2 * 2 * 2
    assert specs[:3] == [
        dict(family="yaml_key", depth=0.1, n_tokens=96, seed=5),
        dict(family="yaml_key", depth=0.1, n_tokens=96, seed=6),
        dict(family="yaml_key", depth=0.9, n_tokens=96, seed=5),
    ]
    assert specs[4]["n_tokens"] == 128 and specs[8]["family"] == "xml_param"


@pytest.mark.parametrize(
    "args, message",
    [
        ((["nope"], [0.5], [96]), "--families: unknown nope; available: "),
        ((["yaml_key"], [1.5], [96]), "--depths: each depth must be between 0 and 1"),
        ((["yaml_key"], [0.5], [63]), "--lengths: each length must be at least 64 tokens"),
    ],
)
def test_bad_values_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        plan_probes(*args)
    with pytest.raises(ValueError, match="--seeds must be at least 1, got 0"):
        plan_probes(["yaml_key"], [0.5], [96], seeds=0)


def test_text_is_quoted_and_checked_option_by_option():
    with pytest.raises(ValueError, match=r"^--depths '0.1,1.5': each depth"):
        plan_from_text("yaml_key", "0.1,1.5", "x", 1, 0, _split)  # the lengths are never parsed
    with pytest.raises(ValueError, match=r"^--lengths '10': each length"):
        plan_from_text("yaml_key", "0.5", "10", 1, 0, _split)
    assert plan_from_text("yaml_key", "0.5", "96", 1, 3, _split) == [
        dict(family="yaml_key", depth=0.5, n_tokens=96, seed=3)
    ]
