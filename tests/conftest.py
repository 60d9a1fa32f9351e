"""Shared fixtures: tiny random models built from configs (nothing is downloaded)."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 2, seed: int = 0,
               dtype: torch.dtype = torch.float64, initializer_range: float = 0.3) -> LlamaForCausalLM:
    """A tiny random Llama in eval mode. A wide initializer makes the logits peaked enough that
    greedy runs are not all one token, and float64 keeps rounding from flipping argmax ties."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, initializer_range=initializer_range,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).to(dtype).eval()


def perturbed_copy(model: LlamaForCausalLM, noise: float, seed: int = 1) -> LlamaForCausalLM:
    """A draft that agrees with `model` often but not always: its weights plus Gaussian noise."""
    draft = LlamaForCausalLM(model.config).to(model.dtype).eval()
    draft.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return draft


@pytest.fixture(scope="session")
def tiny_pair():
    """(target, draft): a 2-layer target and a noisy copy of it as the draft, float64."""
    target = tiny_llama(seed=0)
    return target, perturbed_copy(target, noise=0.05)
