"""Hugging Face's assisted generation as baselines, its rounds recovered from the target's forward passes."""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from specdecpp.compat import cache_in
from specdecpp.engine.settings import DecodingSettings
from specdecpp.evaluation.methods import Counts, MethodSpec, generation_kwargs
from specdecpp.evaluation.arguments import Pair, Prompt

HF_SCHEDULES = ("constant", "heuristic", "dynamic")


def hf_assistant_settings(spec: MethodSpec) -> dict:
    """Hugging Face's assistant settings for one of its schedules."""
    if spec.schedule not in HF_SCHEDULES:
        raise ValueError(f"Hugging Face has no {spec.schedule!r} schedule; choose from {', '.join(HF_SCHEDULES)}")
    dynamic = spec.schedule == "dynamic"
    return {"num_assistant_tokens": spec.num_assistant_tokens,
            "num_assistant_tokens_schedule": "heuristic" if spec.schedule == "heuristic" else "constant",
            "assistant_confidence_threshold": spec.assistant_confidence_threshold if dynamic else 0.0}


def hf_assisted_generate(spec: MethodSpec, pair: Pair, decoding: DecodingSettings) -> Callable[[Prompt, int], Counts]:
    """`target.generate(assistant_model=draft)` with one of Hugging Face's schedules under `decoding`."""
    target, draft = pair.target, pair.draft
    config = copy.deepcopy(draft.generation_config)
    for name, value in hf_assistant_settings(spec).items():
        setattr(config, name, value)
    eos, pad = target.generation_config.eos_token_id, target.generation_config.pad_token_id
    if pad is None and eos is not None:  # else Hugging Face warns that it picks one
        pad = eos[0] if isinstance(eos, list) else eos
    extra = {"pad_token_id": pad} if pad is not None else {}

    def generate(prompt: Prompt, seed: int) -> Counts:
        input_ids = torch.tensor([prompt.ids], device=target.get_input_embeddings().weight.device)
        torch.manual_seed(seed)
        with _generation_config(draft, config), count_forwards(target) as target_calls, \
                count_forwards(draft) as draft_calls:
            sequences = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft,
                                        max_new_tokens=prompt.max_new_tokens, **generation_kwargs(decoding), **extra)
        tokens = sequences[0, len(prompt.ids):].tolist()
        try:
            accepted, drafted = rounds_from_target_calls(target_calls, len(prompt.ids), len(tokens))
        except ValueError as error:
            raise ValueError(f"{spec.name}, prompt {prompt.id}: Hugging Face's rounds cannot be recovered from its "
                             f"target forwards {target_calls}: {error}") from None
        return Counts(tokens, len(target_calls), len(draft_calls), sum(drafted) - sum(accepted), accepted)

    return generate


@contextmanager
def _generation_config(model: PreTrainedModel, config) -> Iterator[None]:
    saved, model.generation_config = model.generation_config, config
    try:
        yield
    finally:
        model.generation_config = saved


@contextmanager
def count_forwards(model: PreTrainedModel) -> Iterator[list[tuple[int, int]]]:
    """Within the block, append `(new tokens, cached tokens)` to the yielded list at each forward of `model`."""
    calls: list[tuple[int, int]] = []

    def hook(module, args, kwargs):
        input_ids = kwargs["input_ids"] if kwargs.get("input_ids") is not None else args[0]
        cache = cache_in(kwargs)
        calls.append((input_ids.shape[1], cache.get_seq_length() if cache is not None else 0))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def rounds_from_target_calls(calls: list[tuple[int, int]], prompt_length: int,
                             generated: int) -> tuple[list[int], list[int]]:
    """Per round (one target forward each): `(accepted, drafted)`; ValueError naming a round it cannot recover."""
    if not calls:
        raise ValueError("no target forward pass was recorded")
    starts, drafted = [], []
    for round_index, (new, cached) in enumerate(calls):
        if (cached == 0) != (round_index == 0):
            raise ValueError(f"round {round_index}: the target's forward saw {cached} cached tokens; only the first "
                             "forward may start from an empty cache (was the cache passed under a name we do not "
                             "read?)")
        starts.append(cached + 1 - prompt_length if cached else 0)  # tokens generated before this round
        drafted.append(new - 1 if cached else new - prompt_length)
    ends = starts[1:] + [generated]
    for round_index, (k, start, end) in enumerate(zip(drafted, starts, ends)):
        if k < 0 or not 1 <= end - start <= k + 1:
            raise ValueError(f"round {round_index}: {end - start} tokens emitted (generated {start} -> {end}) after "
                             f"{k} drafted; a round emits 1 to k + 1 tokens and the rounds add up to the "
                             f"{generated} generated")
    return [end - start - 1 for start, end in zip(starts, ends)], drafted
