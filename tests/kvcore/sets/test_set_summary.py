"""The per-configuration summary: a seeded bootstrap (same rows, same interval) over one value per prompt."""

import math

import numpy as np

from kvcore.measure.export import SET_SUMMARY_COLUMNS
from kvcore.sets.rounds import Job, balanced_shards
from kvcore.sets.summary import bootstrap_interval, summary_rows


def test_bootstrap_is_seeded_and_brackets_the_mean():
    values = [0.1, 0.4, 0.35, 0.8, 0.05, 0.6]
    mean, low, high = bootstrap_interval(values)
    assert mean == np.mean(values) and low < mean < high
    assert bootstrap_interval(values) == (mean, low, high)
    assert bootstrap_interval(values, seed=1) != (mean, low, high)
    # more of the same spread: a narrower interval
    _, low4, high4 = bootstrap_interval(values * 4)
    assert high4 - low4 < high - low


def test_bootstrap_edge_cases():
    assert bootstrap_interval([2.0]) == (2.0, 2.0, 2.0)
    assert all(math.isnan(v) for v in bootstrap_interval([math.nan]))
    assert bootstrap_interval([1.0, math.inf, 3.0])[0] == 2.0


def test_summary_takes_one_value_per_prompt_and_keeps_configuration_order():
    def row(prompt, method, kl, recalled=""):
        cells = dict(method=method, schedule="paper", retention_ratio="0.5", key_bits="16", group_size="")
        return {
            **cells,
            "prompt": prompt,
            "kl_mean": kl,
            "agreement": "1.0",
            "nll_delta": "",
            "recalled": recalled,
        }

    rows = [row("a", "snapkv", "0.2", "1")] * 3 + [row("b", "snapkv", "0.4", "0"), row("a", "h2o", "nan")]
    out = summary_rows(rows)
    assert [r["method"] for r in out] == ["snapkv", "h2o"] and set(out[0]) == set(SET_SUMMARY_COLUMNS)
    assert out[0]["prompts"] == 2 and math.isclose(out[0]["kl_mean"], 0.3)
    assert out[0]["recall_mean"] == 0.5 and out[0]["nll_delta_mean"] is None
    assert out[1]["kl_mean"] is None and out[1]["agreement_mean"] == 1.0


def test_shards_balance_tokens_deterministically():
    jobs = [Job(i, (0, 1), w) for i, w in enumerate([900, 100, 500, 400, 300, 200])]
    shards = balanced_shards(jobs, 2)
    assert shards == balanced_shards(list(reversed(jobs)), 2)
    loads = [sum(j.weight for j in s) for s in shards]
    assert sorted(j.prompt for s in shards for j in s) == list(range(6))
    assert max(loads) - min(loads) <= 100
    assert all([j.prompt for j in s] == sorted(j.prompt for j in s) for s in shards)


def test_intervals_from_fewer_than_ten_prompts_are_marked_in_the_rows_the_files_and_the_printout(
    tmp_path, capsys
):
    from kvcore.cli.prompt_sets import _print_summary
    from kvcore.defaults import MIN_PROMPTS_FOR_INTERVAL
    from kvcore.measure.export import write_csv
    from kvcore.sets.results_file import read_results
    from kvcore.sets.summary import summary_json

    def row(prompt, method):
        cells = dict(method=method, schedule="paper", retention_ratio="0.5", key_bits="16", value_bits="16")
        return {
            **cells,
            "fp_recent": "0",
            "group_size": "",
            "prompt": prompt,
            "kl_mean": str(0.1 * (1 + prompt)),
        }

    few, enough = 2, MIN_PROMPTS_FOR_INTERVAL
    rows = [row(p, "snapkv") for p in range(few)] + [row(p, "h2o") for p in range(enough)]
    for r in rows:
        r.update(agreement="1.0", nll_delta="0", compression_ratio="0.5", recalled="")
    out = summary_rows(rows)
    assert [(r["prompts"], r["few_prompts"]) for r in out] == [(few, True), (enough, False)]
    assert (out[0]["kl_low"], out[0]["kl_high"]) == (0.1, 0.2)  # 2 prompts: the interval is their min–max
    assert (
        list(SET_SUMMARY_COLUMNS)[-1] == "few_prompts"
    )  # added last: the columns before it are as they were
    path = tmp_path / "s.summary.csv"
    write_csv(path, out, SET_SUMMARY_COLUMNS)
    assert [line.rsplit(",", 1)[1] for line in path.read_text().splitlines()] == ["few_prompts", "1", "0"]
    assert [c["few_prompts"] for c in summary_json(out)["configurations"]] == [True, False]
    assert [p.few_prompts for p in read_results(path)] == [True, False]
    old = tmp_path / "old.summary.csv"  # written before the column: still read, marked from its prompts
    write_csv(old, out, SET_SUMMARY_COLUMNS[:-1])
    assert [p.few_prompts for p in read_results(old)] == [True, False]
    _print_summary(out)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith(f"(n < {MIN_PROMPTS_FOR_INTERVAL}: min–max of few prompts)")
    assert "few prompts" not in printed[1] and "(10 prompts)" in printed[1]
