"""The cost model: one cost per token, in its flat and measured views, on hand-made counts."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from specdecpp.calibration.threshold import constant_length, replay
from specdecpp.costs import (StepTimes, busy_machine, cost_per_token, cost_ratio, fit_verify_ms, flat_costs,
                                       flat_spent, pass_spread)


def test_flat_view_is_target_calls_plus_c_times_draft_calls_per_token():
    assert cost_per_token(flat_spent(4, 12, 0.25), 10) == pytest.approx(0.7)
    assert math.isnan(cost_per_token(flat_spent(1, 1, 0.25), 0))


def test_measured_view_is_time_over_tokens_in_target_alone_steps():
    times = StepTimes(draft_ms=[2.0, 1.0], verify_ms=[10.0, 12.0, 14.0], target_alone_ms=8.0, round_overhead_ms=0.5)
    spent = sum(times.round_ms(k) for k in (2, 2, 1))  # (14 + 3 + 0.5) * 2 + (12 + 2 + 0.5)
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


def test_verification_times_ignore_one_slow_length():
    # the times: k = 2 timed while the machine was busy, at 5x its neighbours
    fitted = fit_verify_ms([8.3, 14.4, 57.2, 11.6, 11.4, 12.0])
    assert fitted == pytest.approx([8.3, 14.4, 13.0, 11.6, 11.4, 12.0])  # k = 2 from its neighbours, the rest kept
    line = [8.0 + 0.5 * k for k in range(8)]
    slow = line[:3] + [5 * line[3]] + line[4:]
    assert fit_verify_ms([6.0] + slow[1:]) == pytest.approx([6.0] + line[1:])  # a growing line, recovered exactly
    assert fit_verify_ms([20.0, 10.0, 11.0, 12.0])[0] == pytest.approx(10.0)  # k = 0 never above k = 1
    assert fit_verify_ms([7.0]) == [7.0] and fit_verify_ms([6.0, 7.0]) == [6.0, 7.0]
    # a slow first length: from the line of the next two, within the measured range
    assert fit_verify_ms([9.8, 9.27, 5.31, 5.86, 6.21]) == pytest.approx([5.31, 5.31, 5.31, 5.86, 6.21])
    # one fast length inside, one slow length at the end: each from the line of its two nearest lengths
    assert fit_verify_ms([0.85, 1.19, 0.52, 1.4, 2.85]) == pytest.approx([0.85, 1.19, 1.295, 1.4, 2.28])
    # a length within 10% of a nearest one is measured, not noise
    assert fit_verify_ms([5.0, 5.0, 5.4, 5.0, 5.1]) == pytest.approx([5.0, 5.0, 5.4, 5.0, 5.1])


def test_verification_times_keep_a_change_of_cost_over_several_lengths():
    # an H200's compiled zoo target: its kernels change with the verified length, in steps of five lengths
    measured = [0.76] + [1.0] * 5 + [2.4] * 5 + [1.85] * 5 + [1.2] * 5
    assert fit_verify_ms(measured) == pytest.approx(measured)
    measured[8] = 9.0  # and one slow length inside a step is still ignored
    assert fit_verify_ms(measured)[8] == pytest.approx(2.4)
    # this CPU's compiled zoo target: verifying 3 drafted tokens costs 0.45 ms more than 2, and 4 about what 3 does
    measured = [2.08, 2.28, 2.42, 2.87, 2.89, 3.12, 3.47, 3.68, 3.92]
    assert fit_verify_ms(measured) == pytest.approx(measured)
    assert fit_verify_ms([12.0, 11.0, 10.0, 9.0]) == pytest.approx([11.0, 11.0, 10.0, 9.0])  # and a falling one


def test_the_spread_between_passes_says_when_the_machine_was_busy():
    steady = [[10.0, 10.2, 9.9, 10.1, 10.0, 9.8], [12.0, 12.1, 11.9, 12.2, 12.0, 11.8]]
    noisy = [[10.0, 18.0, 9.5, 25.0, 11.0, 16.0], [12.0, 30.0, 12.5, 19.0, 12.2, 21.0]]
    assert pass_spread(steady) < 0.05 and pass_spread(noisy) > 0.25 and pass_spread([[10.0]]) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not busy_machine(pass_spread(steady))
    with pytest.warns(UserWarning, match=r"busy while the step times were timed: the timing passes spread by \d+%.*"
                                         r"above the 25%.*quieter machine, or pass --step_times_from"):
        assert busy_machine(pass_spread(noisy))


def test_a_tree_round_prices_each_level_by_the_nodes_it_expands():
    times = StepTimes(draft_ms=[0.5, 0.4], verify_ms=[2.0, 2.5, 3.0], target_alone_ms=2.0, round_overhead_ms=0.1,
                      level_ms=[0.6, 0.9])
    # levels expanding 1, 2 and 3 nodes (past the widest timed: the widest's price), the root's 0.1 dearer as the
    # chain's first step is than its cheapest; 5 nodes on the slope 0.5
    assert times.tree_round_ms([1, 2, 3], 5) == pytest.approx(4.5 + (0.6 + 0.1) + 0.9 + 0.9 + 0.1)
    untimed = StepTimes(draft_ms=[0.5, 0.4], verify_ms=[2.0, 2.5, 3.0], target_alone_ms=2.0)
    # without level prices, each level is the chain's draft step at its place (past the timed ones, the last)
    assert untimed.tree_round_ms([1, 4, 4], 2) == pytest.approx(3.0 + 0.5 + 0.4 + 0.4)
