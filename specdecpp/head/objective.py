"""The head's objective: the weighted BCE on soft acceptance labels, the mean binary KL, `IGNORE` (no Trainer)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from transformers import EvalPrediction

IGNORE = -100.0  # label of positions the loss skips (Trainer also pads predictions with -100)


def acceptance_loss(logits: torch.Tensor, labels: torch.Tensor, weight_mismatch: float) -> torch.Tensor:
    """The weighted BCE `sum[w (1-y) (-log(1-s)) + y (-log s)] / sum[w (1-y) + y]` over labelled positions."""
    keep = labels != IGNORE
    y = labels[keep].float()
    log_probs = logits[keep].float().log_softmax(-1)  # [:, 0] = log(1 - s), [:, 1] = log s
    weights = weight_mismatch * (1 - y)
    return (weights * -log_probs[:, 0] + y * -log_probs[:, 1]).sum() / (weights + y).sum().clamp_min(1e-12)


def binary_kl(labels: np.ndarray, predictions: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary KL(label || prediction) over the positions whose label is not IGNORE."""
    keep = labels != IGNORE
    y, s = labels[keep].astype(np.float64), np.clip(predictions[keep].astype(np.float64), eps, 1 - eps)
    kl = (np.where(y > 0, y * np.log(np.maximum(y, eps) / s), 0.0)
          + np.where(y < 1, (1 - y) * np.log(np.maximum(1 - y, eps) / (1 - s)), 0.0))
    return float(kl.mean())


def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
    """Trainer's eval metrics: binary KL and the mean predicted / labelled accept rates."""
    labels, predictions = np.asarray(prediction.label_ids), np.asarray(prediction.predictions)
    keep = labels != IGNORE
    return {"binary_kl": binary_kl(labels, predictions), "mean_prediction": float(predictions[keep].mean()),
            "mean_label": float(labels[keep].mean())}
