"""The cost model: one cost per token, in its flat and measured views, on hand-made counts."""
from __future__ import annotations

import math

import numpy as np
import pytest

from specdecpp.costs import StepTimes, cost_per_token, cost_ratio, flat_costs, flat_spent
from specdecpp.threshold import constant_length, replay


def test_flat_view_is_target_calls_plus_c_times_draft_calls_per_token():
    assert cost_per_token(flat_spent(4, 12, 0.25), 10) == pytest.approx(0.7)
    assert math.isnan(cost_per_token(flat_spent(1, 1, 0.25), 0))


def test_measured_view_is_time_over_tokens_in_target_alone_steps():
    times = StepTimes(draft_ms=[2.0, 1.0], verify_ms=[10.0, 12.0, 14.0], target_alone_ms=8.0, round_overhead_ms=0.5)
    spent = times.predicted_ms([2, 2, 1])  # (14 + 3 + 0.5) * 2 + (12 + 2 + 0.5)
    assert spent == pytest.approx(49.5)
    assert cost_per_token(spent, 6, times.target_alone_ms) == pytest.approx(49.5 / 8.0 / 6)


def test_cost_ratio_of_step_times_is_a_draft_step_over_a_four_token_verification():
    times = StepTimes(draft_ms=[3.0, 1.0, 1.0, 1.0, 1.0], verify_ms=[5.0, 6.0, 7.0, 8.0, 10.0, 11.0],
                      target_alone_ms=5.0)
    assert times.cost_ratio() == pytest.approx(1.0 / 10.0)
    assert cost_ratio([1.0, 9.0, 2.0], [10.0, 20.0, 40.0, 30.0], k=3) == {
        "cost_ratio": 2.0 / 25.0, "draft_step_ms": 2.0, "target_verify_ms": 25.0, "k": 3}
    assert flat_costs({"K=2": [0.5, 1.0]}, times) == {"K=2": pytest.approx(0.6)}


def test_under_flat_step_times_both_views_agree():
    times = StepTimes(draft_ms=[1.5] * 6, verify_ms=[6.0] * 7, target_alone_ms=6.0)
    accept = [np.array([1, 1, 0, 1, 1, 1, 0, 1], dtype=float), np.array([0, 1, 1, 1], dtype=float)]
    replayed = replay(accept, accept, constant_length(3), 6, times)
    flat = cost_per_token(flat_spent(replayed["target_calls"], replayed["draft_calls"], times.cost_ratio()),
                          replayed["tokens"])
    assert replayed["flat_cost_per_token"] == pytest.approx(flat)
    assert replayed["cost_per_token"] == pytest.approx(replayed["flat_cost_per_token"])
