"""Drafting a batch of requests' rounds in lockstep (the vLLM proposer's shape): each request's
first step runs alone, then the requests still drafting take one batched forward per step.
"""
from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from specdecpp.compat import cache_kwargs, special_layers
from specdecpp.engine.decoding import GenerationStats
from specdecpp.engine.draft_step import DraftStep, EagerDraft, proposed_step
from specdecpp.engine.schedules import Schedule


def draft_rounds(drafts: list[EagerDraft], seqs: list[list[int]], policies: list[Schedule], max_tokens: list[int],
                 do_sample: bool, generator: torch.Generator | None,
                 stats: GenerationStats) -> list[tuple[list[int], list[torch.Tensor]]]:
    """The drafting half of several requests' rounds: request `i` drafts up to `max_tokens[i]`
    tokens after `seqs[i]` until `policies[i]` (its round started) stops, as `decoding.draft_round`
    drafts one request. Returns, per request, the tokens and (sampling) their distributions."""
    rounds = [([], []) for _ in drafts]
    drafting = [i for i in range(len(drafts)) if max_tokens[i] > 0]
    num_drafted = 1
    while drafting:
        start = time.perf_counter()
        contexts = [seqs[i] + rounds[i][0] for i in drafting]
        if num_drafted == 1 or len(drafting) == 1:
            steps = [drafts[i].draft_step(context, num_drafted, generator) for i, context in zip(drafting, contexts)]
        else:
            steps = draft_steps([drafts[i] for i in drafting], contexts, num_drafted, generator)
        drafted_at = time.perf_counter()
        still = []
        for i, step in zip(drafting, steps):
            stop = policies[i].stop_after(step)
            rounds[i][0].append(step.token)
            if do_sample:
                rounds[i][1].append(step.probs)
            if not stop and num_drafted < max_tokens[i]:
                still.append(i)
        stats.schedule_time += time.perf_counter() - drafted_at
        stats.draft_time += drafted_at - start
        stats.draft_calls += len(drafting)
        drafting, num_drafted = still, num_drafted + 1
    return rounds


def steps_together(draft: EagerDraft, tokens: list[int]) -> bool:
    """Whether `draft`'s next step can join a batched one: its cache holds all of `tokens` but the
    last, in plain full-attention layers, and a head's state is its output layer's input."""
    return (draft.cache.get_seq_length() == len(tokens) - 1
            and not special_layers(draft.cache)
            and (not draft.with_hidden_states or draft.output_input_is_hidden is True))


def draft_steps(drafts: list[EagerDraft], seqs: list[list[int]], num_drafted: int,
                generator: torch.Generator | None = None) -> list[DraftStep]:
    """One draft step for several requests, each after its own `seqs[i]`: one forward over their
    last tokens, caches padded on the left, each request's new keys and values appended to its own
    cache and its token proposed as `EagerDraft.draft_step` proposes it. Others step alone."""
    together = [i for i, (draft, seq) in enumerate(zip(drafts, seqs)) if steps_together(draft, seq)]
    steps = {i: drafts[i].draft_step(seqs[i], num_drafted, generator) for i in range(len(drafts)) if i not in together}
    if len(together) == 1:
        steps[together[0]] = drafts[together[0]].draft_step(seqs[together[0]], num_drafted, generator)
    elif together:
        logits, states = _forward_together([drafts[i] for i in together], [seqs[i] for i in together])
        for row, i in enumerate(together):
            state = states[row] if drafts[i].with_hidden_states else None
            steps[i] = proposed_step(drafts[i].processing, seqs[i], logits[row], state, num_drafted, generator)
    return [steps[i] for i in range(len(drafts))]


def _forward_together(drafts: list[EagerDraft], seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's forward over each request's last token, batched: logits `[n, vocab]` and the
    output layer's inputs `[n, hidden]`, each request's cache extended by its new position."""
    model, device = drafts[0].model, drafts[0].device
    lengths = [len(seq) - 1 for seq in seqs]
    longest = max(lengths)
    batch = DynamicCache(config=model.config)
    for layer in range(len(drafts[0].cache.layers)):
        keys, values = ([torch.nn.functional.pad(getattr(d.cache.layers[layer], part), (0, 0, longest - n, 0))
                         for d, n in zip(drafts, lengths)] for part in ("keys", "values"))
        batch.update(torch.cat(keys), torch.cat(values), layer)
    mask = torch.arange(longest + 1, device=device)[None] >= torch.tensor(
        [longest - n for n in lengths], device=device)[:, None]
    captured = []
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda module, args: captured.append(args[0]))
    try:
        out = model(input_ids=torch.tensor([seq[-1:] for seq in seqs], device=device), attention_mask=mask.long(),
                    position_ids=torch.tensor([[n] for n in lengths], device=device), logits_to_keep=1,
                    **cache_kwargs(model, batch))
    finally:
        handle.remove()
    for layer in range(len(batch.layers)):
        new_keys, new_values = batch.layers[layer].keys[:, :, -1:], batch.layers[layer].values[:, :, -1:]
        for row, draft in enumerate(drafts):
            draft.cache.update(new_keys[row:row + 1], new_values[row:row + 1], layer)
    return out.logits[:, -1], captured[-1][:, -1]
