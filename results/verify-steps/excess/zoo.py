"""What every script of this folder loads: one torch thread, the zoo pair with its head, held-out prompts."""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from harness import HEAD, load_pair, load_prompt_ids  # noqa: E402

import specdecpp.engine.decoding as decoding  # noqa: E402
from specdecpp import speculative_generate  # noqa: E402
from specdecpp.engine.decoding import GenerationStats, draft_round  # noqa: E402
from specdecpp.engine.processing import sampling_only  # noqa: E402
from specdecpp.measuring.step_timing import TimedRound  # noqa: E402


def zoo(n_begin: int, n_end: int) -> tuple:
    """`(target, draft, head, prompts)`: held-out stdlib prompts `n_begin..n_end`."""
    torch.set_num_threads(1)
    return (*load_pair(head=HEAD), load_prompt_ids("stdlib-heldout", n_begin=n_begin, n_end=n_end))


def continued(target, prompt: torch.Tensor, tokens: int) -> torch.Tensor:
    """`prompt` and the target's greedy continuation of `tokens` tokens."""
    return speculative_generate(target, None, prompt, max_new_tokens=tokens, eos_token_id=[]).sequences


def time_verifications(timed: list) -> None:
    """From now on the loop's every verification appends `(drafted tokens, ms)` to `timed`."""
    verify = decoding.verify

    def timed_verify(target_model, seq, drafted, *rest):
        start = time.perf_counter()
        out = verify(target_model, seq, drafted, *rest)
        timed.append((len(drafted), 1000 * (time.perf_counter() - start)))
        return out

    decoding.verify = timed_verify


def round_ms(target_model, draft_model, seq: list[int], k: int) -> float:
    """One round of `k` drafted tokens after `seq` as the loop takes it; returns its verification's ms and rolls
    both caches back."""
    stats = GenerationStats()
    drafted = draft_round(draft_model, seq, TimedRound(k, None, stats), k, False, None, stats)[0]
    start = time.perf_counter()
    decoding.verify(target_model, seq, drafted, [], sampling_only(False), None)
    ms = 1000 * (time.perf_counter() - start)
    target_model.crop(len(seq) - 1)
    draft_model.crop(len(seq) - 1)
    return ms
