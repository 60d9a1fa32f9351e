"""Timing the engine's steps (`specdecpp.measuring.step_timing`)."""
from __future__ import annotations

import pytest
import torch

from specdecpp.measuring.step_timing import measure_cost_ratio


def test_cost_ratio_is_measured_on_cached_steps(tiny_pair):
    target, draft = tiny_pair
    cost = measure_cost_ratio(target, draft, torch.tensor([[1, 2, 3, 4, 5]]), steps=3, warmup_steps=1)
    assert cost["cost_ratio"] == pytest.approx(cost["draft_step_ms"] / cost["target_verify_ms"])
    assert cost["k"] == 4 and cost["steps"] == 3
