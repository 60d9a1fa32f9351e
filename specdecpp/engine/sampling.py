"""Sampling: `generate`'s warpers, the draft's proposal (`DraftStep`, `proposed_token`) and the residual."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

# The warpers `make_warpers` builds: all the compiled draft step applies inside its graph.
SAMPLING_WARPERS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)


@dataclass
class DraftStep:
    """The `num_drafted`-th drafted token of a round: the token, its draft probability, the distribution `probs` it
    was drawn from (`warped`: processed), the raw `logits`, the hidden state a head reads and its `accept_prob`."""

    num_drafted: int
    token_prob: float
    hidden: torch.Tensor | None = None
    token: int = -1
    logits: torch.Tensor | None = None
    probs: torch.Tensor | None = None
    warped: bool = False
    accept_prob: float | None = None


def make_warpers(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> LogitsProcessorList:
    """The warpers `generate` would apply for these settings (none for the neutral values)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers


def widened(logits: torch.Tensor) -> torch.Tensor:
    """`logits` in float32 when half precision, else as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of `probs` `[n, vocab]` -> `[n]`."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def draft_noise(vocab: int, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """`E_i ~ Exp(1)` per token (float64) from `generator`: a sampled draft token's randomness, drawn outside graphs."""
    return torch.empty(vocab, dtype=torch.float64, device=device).exponential_(generator=generator)


def proposed_token(logits: torch.Tensor, probs: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """The draft's token, for every engine: greedy (`noise` None) the argmax of `logits`, else the
    argmax of `probs / noise`, an exact sample (the exponential race `torch.multinomial` runs)."""
    return logits.argmax(-1) if noise is None else (probs / noise).argmax(-1)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """`normalize(max(0, p - q))`, or `p` where the residual has no mass."""
    residual = (p - q).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp_min(torch.finfo(residual.dtype).tiny), p)
