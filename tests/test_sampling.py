"""Logits processing and the residual distribution."""
import pytest
import torch

from specdecpp.engine.sampling import make_warpers, residual_distribution, sample, widened


def logits_to_probs(logits, warpers):
    return warpers(None, logits).softmax(-1)


def test_warpers_match_temperature_top_k_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    assert torch.allclose(logits_to_probs(logits, make_warpers()), logits.softmax(-1))
    assert torch.allclose(logits_to_probs(logits, make_warpers(temperature=0.5)), (logits / 0.5).softmax(-1))
    top2 = logits_to_probs(logits, make_warpers(top_k=2))
    assert (top2[0, 2:] == 0).all() and torch.allclose(top2[0, :2], logits[0, :2].softmax(-1))
    top_p = logits_to_probs(logits, make_warpers(top_p=0.6))
    assert (top_p > 0).tolist() == [[True, False, False, False]]


def test_half_precision_logits_are_upcast():
    assert widened(torch.zeros(1, 3, dtype=torch.bfloat16)).dtype == torch.float32
    assert widened(torch.zeros(1, 3, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_settings(settings):
    with pytest.raises(ValueError):
        make_warpers(**settings)


def test_residual_distribution():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual_distribution(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(residual_distribution(p, p), p)  # no residual mass: fall back to p


def test_sample_uses_the_generator():
    probs = torch.full((3, 10), 0.1)
    draws = [sample(probs, torch.Generator().manual_seed(4)) for _ in range(2)]
    assert torch.equal(*draws) and draws[0].shape == (3,)
