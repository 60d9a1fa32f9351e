"""What every script of this folder loads: one torch thread, the zoo pair with its head, held-out prompts."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from harness import HEAD, load_pair, load_prompt_ids  # noqa: E402

from specdecpp import speculative_generate  # noqa: E402


def zoo(n_begin: int, n_end: int) -> tuple:
    """`(target, draft, head, prompts)`: held-out stdlib prompts `n_begin..n_end`."""
    torch.set_num_threads(1)
    return (*load_pair(head=HEAD), load_prompt_ids("stdlib-heldout", n_begin=n_begin, n_end=n_end))


def continued(target, prompt: torch.Tensor, tokens: int) -> torch.Tensor:
    """`prompt` and the target's greedy continuation of `tokens` tokens."""
    return speculative_generate(target, None, prompt, max_new_tokens=tokens, eos_token_id=[]).sequences
