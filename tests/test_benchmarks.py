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


def test_processing_overhead_tabulates_medians_and_per_prompt_ratios():
    benchmark = load_benchmark("processing_overhead")
    times = {(schedule, penalty): values for schedule in benchmark.SCHEDULES
             for penalty, values in ((None, [2.0, 4.0, 3.0]), (1.2, [2.2, 4.0, 3.6]))}
    lines = benchmark.table(times, 1.2).splitlines()
    assert lines[0] == "| schedule | none (ms/token) | repetition_penalty=1.2 (ms/token) | ratio |"
    assert lines[2:] == [f"| {s} | 3.00 | 3.60 | 1.100 |" for s in benchmark.SCHEDULES]
