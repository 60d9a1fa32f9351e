"""Benchmark scripts that no unit test of a module covers, run at tiny sizes (their figures are
timings, so the tests check their shape, never their values)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from specdecpp import compiled

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not compiled.STATIC_CACHE_CROPS, reason="transformers < 5.24: compile=True is refused")
def test_compiled_steps_times_both_engines_on_models_built_from_configs(tmp_path):
    benchmark = load_benchmark("compiled_steps")
    output = tmp_path / "steps.json"
    [result] = benchmark.main(["--pairs", "tiny", "--dtype", "float32", "--device", "cpu", "--context", "16",
                               "--max_draft", "4", "--passes", "1", "--output_json", str(output)])
    assert json.loads(output.read_text()) == [result]
    assert result["compile_seconds"] > 0 and result["device"].startswith("cpu")
    steps = [row["step"] for row in result["rows"]]
    assert "target alone" in steps and "round of 4, each judged" in steps and "verify 8 drafted" not in steps
    assert all(row["eager_ms"] > 0 and row["compiled_ms"] > 0 for row in result["rows"])
    assert result["step_times"]["compiled/judged"]["engine"] == "compiled"
    assert result["step_times"]["eager/plain"]["engine"] == "eager"


def test_processing_overhead_tabulates_medians_ratios_and_per_step_times():
    from specdecpp.decoding import GenerationStats
    benchmark = load_benchmark("processing_overhead")

    def stats(wall_ms: float, target_calls: int = 50, draft_calls: int = 100) -> GenerationStats:
        return GenerationStats(target_calls=target_calls, draft_calls=draft_calls, generated_length=100,
                               wall_time=wall_ms / 10, verify_time=target_calls * 0.004, draft_time=draft_calls * 0.001)
    runs = {(schedule, penalty): [stats(ms) for ms in values] for schedule in benchmark.SCHEDULES
            for penalty, values in ((None, [2.0, 4.0, 3.0]), (1.2, [2.2, 4.0, 3.6]))}
    runs["ada", 1.2] = [stats(ms, 40, 120) for ms in (2.2, 4.0, 3.6)]
    lines = benchmark.table(runs, 1.2).splitlines()
    assert lines[0].startswith("| schedule | none (ms/token) | repetition_penalty=1.2 (ms/token) | ratio |")
    assert lines[2] == "| none | 3.00 | 3.60 | 1.100 | 0.500 → 0.500 | 1.000 → 1.000 | 4.000 → 4.000 | 1.000 → 1.000 |"
    assert lines[-1] == "| ada | 3.00 | 3.60 | 1.100 | 0.500 → 0.400 | 1.000 → 1.200 | 4.000 → 4.000 | 1.000 → 1.000 |"


def test_results_tables_pool_seeds_by_summing_counts():
    """Two seeds of one evaluation pool into one run: calls summed over tokens, the cost at the
    given c, the median speedup; runs of other methods are refused."""
    tables = load_benchmark("results_tables")

    def run(seed: int, tokens: int, target_calls: int, draft_calls: int, speedup: float) -> dict:
        row = {"method": "specdecpp:constant@K=2", "generated_tokens": tokens, "speedup": speedup,
               "mean_accepted_length": tokens / target_calls - 1, "target_calls_per_token": target_calls / tokens,
               "draft_calls_per_token": draft_calls / tokens, "discarded_per_token": 0.0, "cost_per_token": 0.0}
        return {"title": "t", "prompts": 1, "summary": [row], "cost": {"cost_ratio": 0.3}, "settings": {"seed": seed}}

    document = tables.pooled([run(0, 100, 50, 100, 1.0), run(1, 300, 100, 200, 1.4)], cost_ratio=0.2)
    row = document["summary"][0]
    assert row["generated_tokens"] == 400 and row["speedup"] == pytest.approx(1.2)
    assert row["target_calls_per_token"] == pytest.approx(150 / 400)
    assert row["cost_per_token"] == pytest.approx((150 + 0.2 * 300) / 400)
    assert row["mean_accepted_length"] == pytest.approx((400 - 150) / 150)
    assert document["title"] == "t, 2 seeds (0, 1) pooled"
    other = run(2, 10, 5, 10, 1.0)
    other["summary"][0]["method"] = "target"
    with pytest.raises(ValueError, match="same methods"):
        tables.pooled([run(0, 100, 50, 100, 1.0), other])
