"""Summary figures, the cost model and the figures drawn from them (no models needed but one
tiny pair for the cost ratio)."""
from __future__ import annotations

import json

import pytest

from specdecpp.costs import FLAT_COST
from specdecpp.evaluation import plots
from specdecpp.measuring import metrics


def record(method, pid, *, tokens, seconds, target_time, calls, draft_calls, discarded, accepted, matches,
           engine="specdecpp", schedule="constant", k=None, threshold=None):
    return {"id": pid, "method": method, "engine": engine, "schedule": schedule, "num_assistant_tokens": k,
            "stop_threshold": threshold, "generated_length": tokens, "spec_time": seconds, "target_time": target_time,
            "num_LM_call": calls, "draft_calls": draft_calls, "num_mismatched_tokens": discarded,
            "accepted_lengths": accepted, "matches_target": matches}


RECORDS = [
    record("target", 0, tokens=10, seconds=2.0, target_time=2.0, calls=10, draft_calls=0, discarded=0, accepted=None,
           matches=None, engine=None, schedule="none"),
    record("specdecpp:constant@K=4", 0, tokens=10, seconds=1.0, target_time=2.0, calls=4, draft_calls=12, discarded=6,
           accepted=[2, 4, 0, 0], matches=True, k=4),
    record("target", 1, tokens=30, seconds=9.0, target_time=9.0, calls=30, draft_calls=0, discarded=0, accepted=None,
           matches=None, engine=None, schedule="none"),
    record("specdecpp:constant@K=4", 1, tokens=30, seconds=2.0, target_time=9.0, calls=6, draft_calls=24, discarded=0,
           accepted=[4, 4, 4, 4, 4, 4], matches=False, k=4),
]


def test_summary_pools_counts_and_takes_paired_medians_of_times():
    target, constant = metrics.summarize(RECORDS, cost_ratio=0.5)
    assert target["method"] == "target" and target["cost_per_token"] == 1.0
    assert target["mean_accepted_length"] is None and target["greedy_checked"] is None
    assert constant["generated_tokens"] == 40
    assert constant["target_calls_per_token"] == pytest.approx(10 / 40)   # pooled, not a mean of ratios
    assert constant["discarded_per_token"] == pytest.approx(6 / 40)
    assert constant["cost_per_token"] == pytest.approx((10 + 0.5 * 36) / 40)
    assert constant["mean_accepted_length"] == pytest.approx(30 / 10)
    assert constant["speedup"] == pytest.approx((2.0 + 4.5) / 2)          # median of 2.0x and 4.5x
    assert constant["tokens_per_s"] == pytest.approx((10 + 15) / 2)
    assert (constant["greedy_identical"], constant["greedy_checked"]) == (1, 2)


def test_unknown_counts_stay_unknown():
    rows = [dict(r, draft_calls=None) for r in RECORDS if r["method"] != "target"]
    (row,) = metrics.summarize(rows, cost_ratio=0.5)
    assert row["draft_calls_per_token"] is None and row["cost_per_token"] is None
    cells = [c.strip() for c in metrics.format_table([row]).splitlines()[2].split("|")[1:-1]]
    assert cells[5] == "-" and cells[7] == "-"  # draft/tok and cost/tok


def test_greedy_verdict_names_the_methods_that_differ():
    summary = metrics.summarize(RECORDS, cost_ratio=0.5)
    assert metrics.greedy_verdict(summary) == (
        "greedy check FAILED, outputs differ from the target's: specdecpp:constant@K=4 (1/2)")
    passing = metrics.summarize([dict(r, matches_target=True) if r["engine"] else r for r in RECORDS], 0.5)
    assert metrics.greedy_verdict(passing).startswith("greedy check passed")
    assert metrics.greedy_verdict(metrics.summarize(RECORDS[:1], 0.5)) is None


def test_greedy_verdict_reports_near_ties_apart_from_failures():
    summary = metrics.summarize(RECORDS, cost_ratio=0.5)
    tie = [dict(r, first_difference_margin=0.0034 if r["matches_target"] is False else None) for r in RECORDS]
    assert metrics.greedy_verdict(summary, tie) == (
        "greedy check passed up to near-ties: every method (1) reproduces the target's output on every prompt "
        "(2 prompts) except where the target's top two logits are less than 0.01 apart: "
        "specdecpp:constant@K=4: prompt 1 differs at a near-tie (margin 0.0034)")
    wide = [dict(r, first_difference_margin=0.5 if r["matches_target"] is False else None) for r in RECORDS]
    assert metrics.greedy_verdict(summary, wide) == (
        "greedy check FAILED, outputs differ from the target's: specdecpp:constant@K=4 (1/2)")
    assert metrics.greedy_verdict(summary, RECORDS) == metrics.greedy_verdict(summary)  # older records: no margin


def test_table_has_a_line_per_method_and_states_the_cost_ratio():
    table = metrics.format_table(metrics.summarize(RECORDS, 0.5), cost_ratio=0.5)
    lines = table.splitlines()
    assert lines[0].startswith("| method") and set(lines[1]) <= {"|", "-", ":"}
    assert lines[2].startswith("| target ") and lines[3].startswith("| specdecpp:constant@K=4 ")
    assert "3.25x" in lines[3] and "1/2" in lines[3]
    assert f"| {FLAT_COST} |" in lines[0] and "c = 0.500" in lines[4]  # the cost's view and unit are named


# -- figures ---------------------------------------------------------------------------------------
def test_pareto_front_keeps_only_undominated_points():
    points = [(1.0, 0.5), (0.5, 0.6), (2.0, 0.4), (1.5, 0.55), (0.5, 0.7)]
    assert plots.pareto_front(points) == [(0.5, 0.6), (1.0, 0.5), (2.0, 0.4)]


def test_figures_are_written_as_png(tmp_path):
    rows = metrics.summarize(RECORDS + [dict(r, method="specdecpp:ada@0.3", schedule="ada", threshold=None,
                                             stop_threshold=0.3, num_assistant_tokens=None)
                                        for r in RECORDS if r["engine"]], 0.5)
    for draw, name in ((plots.plot_pareto, "pareto.png"), (plots.plot_speedup, "speedup.png")):
        path = draw(rows, tmp_path / name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_speedup_figure_compares_with_the_fastest_of_each_family():
    rows = metrics.summarize(RECORDS, 0.5)
    faster = dict(rows[1], method="specdecpp:constant@K=2", num_assistant_tokens=2, speedup=9.0)
    draft = dict(rows[0], method="draft", speedup=6.0)
    ada = dict(rows[1], method="specdecpp:ada@0.3", schedule="ada", stop_threshold=0.3)
    lines = plots._fastest_per_family(rows + [faster, draft, ada])
    assert [row["method"] for row in lines] == ["target", "specdecpp:constant@K=2"]


def test_figures_are_redrawn_from_a_saved_summary(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"title": "t", "summary": metrics.summarize(RECORDS, 0.5)}))
    paths = plots.redraw(tmp_path / "summary.json")
    assert [p.name for p in paths] == ["pareto.png", "speedup_vs_threshold.png"] and all(p.exists() for p in paths)
