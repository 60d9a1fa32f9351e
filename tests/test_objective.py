"""The loss and the metric the head is trained and measured by, against hand computations."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specdecpp.head.objective import IGNORE, acceptance_loss, binary_kl


def test_loss_equals_hand_computation():
    # two sequences, the first position of each ignored (a prefix), one position mixed out
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)], [1.0, 0.0]],
                           [[5.0, 5.0], [math.log(4.0), 0.0], [0.0, 0.0]]])
    labels = torch.tensor([[IGNORE, 1.0, 0.25], [IGNORE, 0.0, IGNORE]])
    s = [0.75, 1 / (1 + math.e), 0.2]  # softmax(...)[1] at the three labelled positions
    y, w = [1.0, 0.25, 0.0], 6.0
    num = sum(w * (1 - yi) * -math.log(1 - si) + yi * -math.log(si) for yi, si in zip(y, s))
    den = sum(w * (1 - yi) + yi for yi in y)
    assert acceptance_loss(logits, labels, w).item() == pytest.approx(num / den, rel=1e-6)


def test_binary_kl_hand_computation():
    labels = np.array([[1.0, 0.0, 0.5, IGNORE]])
    predictions = np.array([[0.8, 0.1, 0.25, 0.9]])
    expected = np.mean([math.log(1 / 0.8), math.log(1 / 0.9), 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)])
    assert binary_kl(labels, predictions) == pytest.approx(expected)
    assert binary_kl(np.array([0.3, 1.0]), np.array([0.3, 1.0])) == pytest.approx(0.0, abs=1e-6)
