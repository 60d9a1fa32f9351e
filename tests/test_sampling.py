"""Logits processing, the residual distribution and the acceptance step on synthetic distributions."""
import pytest
import torch
from scipy.stats import chisquare

from specdecpp.engine.decoding import _verify
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


def draws_by_position(p: torch.Tensor, q: torch.Tensor, rounds: int, seed: int = 0) -> torch.Tensor:
    """Run the loop's acceptance step (`_verify`) on `rounds` rounds of `k` tokens drafted from the
    rows of `q` `[k, vocab]` and checked against the rows of `p` `[k + 1, vocab]` (neither depends on
    the prefix). Returns the counts of the emitted tokens per position `[k + 1, vocab]`."""
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros_like(p)
    for _ in range(rounds):
        drafted = torch.multinomial(q, 1, generator=generator)[:, 0].tolist()
        num_accepted, token = _verify(drafted, list(q), p.log(), True, generator)
        for position, emitted in enumerate(drafted[:num_accepted] + [token]):
            counts[position, emitted] += 1
    return counts


def pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of `counts` to `probs`; 0 when an outcome of probability 0 was drawn."""
    if counts[probs == 0].sum() > 0:
        return 0.0
    possible = probs > 0
    return chisquare(counts[possible].numpy(), (probs[possible] * counts.sum()).numpy()).pvalue


def test_the_acceptance_step_emits_the_targets_distribution_at_every_position():
    """Rejection sampling on synthetic distributions: whatever was accepted before it, the token
    emitted at each position follows the target's row there (an accepted draft, a residual draw
    after a rejection, or the bonus token after all were accepted), and the test has the power to
    reject the draft's rows. `p` has a zero where `q` has mass, and `q` zeros where `p` has mass."""
    p = torch.tensor([[0.05, 0.40, 0.30, 0.25, 0.00],
                      [0.50, 0.00, 0.10, 0.20, 0.20],
                      [0.10, 0.20, 0.30, 0.20, 0.20]], dtype=torch.float64)
    q = torch.tensor([[0.40, 0.10, 0.10, 0.00, 0.40],
                      [0.10, 0.30, 0.00, 0.30, 0.30]], dtype=torch.float64)
    counts = draws_by_position(p, q, rounds=4000)
    assert counts[2].sum() > 300  # every position, the bonus one too, is reached often
    for position in range(3):
        assert pvalue(counts[position], p[position]) > 1e-3, position
    for position in range(2):
        assert pvalue(counts[position], q[position]) < 1e-6, position
