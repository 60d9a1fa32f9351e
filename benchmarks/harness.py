"""What the benchmark scripts share, so that each stays short and all measure alike: the embedded
pair's paths, a pair loaded as the commands load it (`models.load_model`, `models.load_head`),
prompts tokenised as the evaluation tokenises them, methods interleaved per prompt with the first
one rotating, an untimed warm-up, and per-token sums of `GenerationStats`.

The scripts import it as a sibling (`from harness import ...`): `python benchmarks/<name>.py` puts
this folder first on `sys.path`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

import torch
from transformers import PreTrainedModel

from specdecpp.engine.compiled import longest_per_capacity
from specdecpp.engine.decoding import GenerationStats
from specdecpp.evaluation.arguments import PromptSource, load_eval_prompts
from specdecpp.head.model import AcceptancePredictionHead
from specdecpp.models import load_head, load_model, load_tokenizer

ZOO = Path(__file__).resolve().parent.parent / "checkpoints" / "zoo"
TARGET, DRAFT, HEAD = (str(ZOO / name) for name in ("target", "draft", "head"))

Method = TypeVar("Method")


def load_pair(target: str | None = TARGET, draft: str | None = DRAFT, head: str | None = None,
              torch_dtype: str = "float32") -> tuple[PreTrainedModel | None, PreTrainedModel | None,
                                                     AcceptancePredictionHead | None]:
    """(target, draft, head) loaded as the commands load them, each None where its path is None.
    float32 by default: the zoo pair stores float16 weights, and the benchmarks time float32."""
    return (load_model(target, torch_dtype) if target else None, load_model(draft, torch_dtype) if draft else None,
            load_head(head) if head else None)


def load_prompt_ids(source: str, tokenizer_of: str = TARGET, n_begin: int = 0, n_end: int | None = None,
                    prompt_format: str = "auto") -> list[torch.Tensor]:
    """Prompts `[n_begin:n_end]` of `source` (a prompt set, a file or a Hub dataset) as `[1, length]`
    token ids, formatted and tokenised by the tokenizer of the model at `tokenizer_of` exactly as
    the evaluation does (`evaluation.arguments.load_eval_prompts`), so that a benchmark and an
    evaluation of the same prompts decode the same inputs."""
    source = PromptSource(prompts=source, prompt_format=prompt_format, n_begin=n_begin, n_end=n_end)
    return [torch.tensor([prompt.ids]) for prompt in load_eval_prompts(source, load_tokenizer(tokenizer_of), 1)]


def rotated(methods: list[Method], n: int) -> list[Method]:
    """The order in which the `n`-th prompt runs `methods`: starting at the `n`-th, as the
    evaluation does, so that load on the machine hits every method alike and none always runs first."""
    return methods[n % len(methods):] + methods[:n % len(methods)]


def warm_up(run: Callable[[Method, torch.Tensor, int], GenerationStats], methods: list[Method],
            prompts: list[torch.Tensor], max_new_tokens: int, tokens: int = 8, compile: bool = False) -> float:
    """Run each method once, untimed, as the evaluation warms up: `run(method, prompt,
    max_new_tokens)` for `tokens` tokens of the first prompt or, when `compile`, for all
    `max_new_tokens` of the longest prompt of each engine capacity the prompts need (so that the compiled
    engine builds its graphs and caches here rather than in a timed run). Returns the seconds spent compiling."""
    if compile:
        longest = longest_per_capacity(prompts, lambda prompt: prompt.shape[1] + max_new_tokens)
        return sum(run(method, prompt, max_new_tokens).compile_time for prompt in longest for method in methods)
    for method in methods:
        run(method, prompts[0], min(tokens, max_new_tokens))
    return 0.0


COUNTED = tuple(f.name for f in fields(GenerationStats)  # the counts and times, not the per-round lists
                if isinstance(getattr(GenerationStats(), f.name), (int, float)))


def summed(runs: Iterable[GenerationStats]) -> dict[str, float]:
    """The sums of the generations' counts and times (`COUNTED`: target and draft calls, discarded
    and generated tokens, wall, draft, verify, schedule and compile time), pooled as the
    evaluation pools them: total over total, never a mean of per-generation ratios."""
    totals = dict.fromkeys(COUNTED, 0)
    for stats in runs:
        for name in COUNTED:
            totals[name] += getattr(stats, name)
    return totals


def per_token(totals: dict[str, float], name: str) -> float:
    """`totals[name]` per generated token (times in seconds stay seconds)."""
    return totals[name] / max(totals["generated_length"], 1)


def ms_per_token(stats: GenerationStats) -> float:
    """One generation's wall time per generated token, in ms."""
    return 1000 * stats.wall_time / max(stats.generated_length, 1)
