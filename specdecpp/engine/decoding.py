"""The speculative decoding loop (Leviathan et al. 2023; Chen et al. 2023): the draft proposes `y_1..y_k` (the
schedule decides `k`), the target scores them in one forward, the accepted prefix and one target token are kept and
both caches are cropped. Greedy output is the target's; sampled output follows the target's distribution."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

import torch
from transformers import PreTrainedModel

from specdecpp.checks import eos_ids, generation_eos, trim_at_eos
from specdecpp.compat import ModelOutput
from specdecpp.engine.compiled import compiled_models, compiled_tree_models, recompiles_forbidden
from specdecpp.engine.draft_step import CachedModel, Draft, EagerDraft, Target
from specdecpp.engine.processing import Processing, build_processing
from specdecpp.engine.sampling import residual_distribution, sample
from specdecpp.engine.schedules import Schedule, make_schedule
from specdecpp.engine.settings import DecodingSettings, default_schedule
from specdecpp.engine.tree import check_tree_attention, grow_tree, verify_tree
from specdecpp.head.model import LeanJudge


@dataclass
class GenerationStats:
    """Counts for one generation: forward passes, per round the tokens drafted, verified and accepted, and seconds
    per phase (compiling outside `wall_time`); for `stop_threshold="auto"`, the threshold used and where its step
    times were timed. Without a stop inside the last round, `generated_length == sum(accepted_lengths) + rounds`."""

    target_calls: int = 0
    draft_calls: int = 0
    discarded_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    draft_lengths: list[int] = field(default_factory=list)
    verified_lengths: list[int] = field(default_factory=list)
    tree_level_widths: list[list[int]] = field(default_factory=list)  # per tree round: the nodes each level expanded
    tree_rounds: int = 0  # rounds drafted as a token tree, the first ones (an `auto` tree's chain drafts the rest)
    generated_length: int = 0
    wall_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    schedule_time: float = 0.0
    compile_time: float = 0.0
    stop_threshold: float | None = None
    threshold_step_times: str | None = None


@dataclass
class SpeculativeOutput(ModelOutput):
    """`sequences` `[1, prompt + generated]` and `stats`, a `GenerationStats`."""

    sequences: torch.LongTensor | None = None
    stats: GenerationStats | None = None


def decode(target: PreTrainedModel, draft: PreTrainedModel | None, input_ids: torch.LongTensor,
           settings: DecodingSettings, *, attention_mask: torch.Tensor | None = None,
           generator: torch.Generator | None = None, streamer=None, tokenizer=None,
           processing: Processing | None = None) -> SpeculativeOutput:
    """The loop for one prompt (batch size 1, no padding) under `settings` (`processing`: as `generate` built it).
    Greedy output equals `target.generate`'s token for token; sampled output follows its distribution."""
    if settings.schedule is None:
        settings = replace(settings, schedule=default_schedule(draft, settings.head))
    settings = settings.with_head_defaults()
    input_ids = _check_input_ids(input_ids)
    settings.validate()
    settings.check_models(target, draft)
    if settings.schedule_class.grows_tree:
        check_tree_attention(target, "the target")
        check_tree_attention(draft, "the draft")
    _check_attention_mask(input_ids, attention_mask)
    max_new_tokens = settings.max_new_tokens
    eos = eos_ids(generation_eos(target) if settings.eos_token_id is None else settings.eos_token_id)
    seq = input_ids[0].tolist()
    prompt_length = len(seq)
    if processing is None:
        processing = build_processing(target, settings.generation_config(prompt_length, eos), input_ids,
                                      settings.logits_processor, settings.stopping_criteria, tokenizer)
    policy = make_schedule(settings, _draft_correct(target, draft, input_ids, settings, processing)
                           if settings.schedule_class.knows_target else None)

    stats = GenerationStats()
    if settings.stop_threshold == "auto" and settings.schedule in ("ada", "ada-tree"):
        stats.stop_threshold, stats.threshold_step_times = policy.stop_threshold, _priced_on(settings)
    target_model, draft_model, stats.compile_time = step_models(
        target, draft if settings.schedule_class.needs_draft else None, settings, processing,
        prompt_length + max_new_tokens)
    chain_models = (target_model, draft_model)  # where an `auto` tree's chain rounds run: compiled, their own engine
    if policy.grows_tree and policy.chain is not None and settings.compile:
        *chain_models, seconds = step_models(target, draft, settings.chain_settings(), processing,
                                             prompt_length + max_new_tokens)
        stats.compile_time += seconds
    start = time.perf_counter()
    if streamer is not None:
        streamer.put(input_ids.cpu())
    with torch.inference_mode(), recompiles_forbidden(settings.compile):
        while (remaining := max_new_tokens - (len(seq) - prompt_length)) > 0:
            if policy.grows_tree and policy.prefers_chain():
                if settings.compile:  # the chain's engine takes what the tree's holds; eager, they are the same
                    for tree_model, chain_model in zip((target_model, draft_model), chain_models):
                        chain_model.take_cache(tree_model)
                policy, (target_model, draft_model) = policy.chain, chain_models
            policy.start_round()
            longest = min(policy.max_draft(), remaining - 1)  # a round emits up to k + 1 tokens
            if policy.grows_tree:
                accepted, next_token, num_drafted = tree_round(target_model, draft_model, seq, policy, longest,
                                                               processing, generator, stats)
                num_verified, num_accepted = num_drafted, len(accepted)
            else:
                drafted, draft_probs = draft_round(draft_model, seq, policy, longest, processing.do_sample, generator,
                                                   stats)
                num_drafted = len(drafted)
                num_verified = policy.verify_length(num_drafted)
                drafted, draft_probs = drafted[:num_verified], draft_probs[:num_verified]
                verify_start = time.perf_counter()
                num_accepted, next_token = verify(target_model, seq, drafted, draft_probs, processing, generator)
                stats.verify_time += time.perf_counter() - verify_start
                accepted = drafted[:num_accepted]
            stats.target_calls += 1
            stats.accepted_lengths.append(num_accepted)
            stats.draft_lengths.append(num_drafted)
            stats.verified_lengths.append(num_verified)
            stats.discarded_tokens += num_drafted - num_accepted
            policy.end_round(num_verified, num_accepted)
            new_tokens = trim_at_eos(accepted + [next_token], eos)
            stop = processing.stop_length(seq, new_tokens)
            new_tokens = new_tokens[:stop]
            seq += new_tokens
            if not policy.grows_tree:  # both caches keep all but the last token, which the next round feeds
                target_model.crop(len(seq) - 1)
                if draft_model is not None:
                    draft_model.crop(len(seq) - 1)
            if streamer is not None:
                streamer.put(torch.tensor(new_tokens))
            if stop is not None or new_tokens[-1] in eos:
                break
    if streamer is not None:
        streamer.end()
    stats.generated_length, stats.wall_time = len(seq) - prompt_length, time.perf_counter() - start
    return SpeculativeOutput(torch.tensor([seq], dtype=torch.long, device=input_ids.device), stats)


def tree_round(target_model: CachedModel, draft_model: EagerDraft, seq: list[int], policy: Schedule, longest: int,
               processing: Processing, generator: torch.Generator | None,
               stats: GenerationStats) -> tuple[list[int], int, int]:
    """A token tree's round after `seq` (at most `longest` levels): grow, verify in one target forward, and pack each
    cache's entries of the accepted path after `seq`. Returns accepted tokens, the target's token, tree size."""
    tree, fed = grow_tree(draft_model, seq, policy, longest, processing, generator, stats)
    stats.tree_rounds += 1
    verify_start = time.perf_counter()
    path, next_token = verify_tree(target_model, seq, tree, processing, generator)
    stats.verify_time += time.perf_counter() - verify_start
    prefix, kept = len(seq), len(path)
    target_model.keep(prefix, [prefix + node for node in path], prefix + kept)
    in_draft = [fed[node] for node in itertools.takewhile(fed.__contains__, path)]
    draft_model.keep(prefix, in_draft, prefix + len(in_draft))
    return [tree.tokens[node] for node in path], next_token, len(tree)


def step_models(target: PreTrainedModel, draft: PreTrainedModel | None, settings: DecodingSettings,
                processing: Processing, max_length: int) -> tuple[Target, Draft | None, float]:
    """The target and (unless None) draft as the loop steps them, empty, eager or compiled, and the compile seconds."""
    head = settings.judging_head
    if not settings.compile:
        judge = LeanJudge(head, draft.device) if head is not None and draft is not None else None
        return CachedModel(target), EagerDraft(draft, processing, judge) if draft else None, 0.0
    if settings.schedule is not None and settings.schedule_class.grows_tree:
        return compiled_tree_models(target, draft, max_length, head, settings.tree_width, processing)
    sampling = (settings.temperature, settings.top_k, settings.top_p) if settings.do_sample else None
    return compiled_models(target, draft, max_length, processing, head, sampling,
                           longest_verification=max(settings.bound[1], settings.num_assistant_tokens) + 1)


def draft_round(draft_model: Draft | None, seq: list[int], policy: Schedule, max_tokens: int, do_sample: bool,
                generator: torch.Generator | None, stats: GenerationStats) -> tuple[list[int], list[torch.Tensor]]:
    """Draft after `seq` until `policy` stops (at most `max_tokens`): the tokens and, sampling, their distributions."""
    drafted, draft_probs = [], []
    while len(drafted) < max_tokens:
        start = time.perf_counter()
        step = draft_model.draft_step(seq + drafted, len(drafted) + 1, generator)
        drafted_at = time.perf_counter()
        stop = policy.stop_after(step)
        stats.schedule_time += time.perf_counter() - drafted_at
        stats.draft_time += drafted_at - start
        stats.draft_calls += 1
        drafted.append(step.token)
        if do_sample:
            draft_probs.append(step.probs)
        if stop:
            break
    return drafted, draft_probs


def verify(target_model: Target, seq: list[int], drafted: list[int], draft_probs: list[torch.Tensor],
           processing: Processing, generator: torch.Generator | None) -> tuple[int, int]:
    """One target forward over `[last verified token, drafted...]`: the accepted count and the token the target adds."""
    tokens = seq + drafted
    target_logits = processing.logits(tokens, target_model.logits(tokens, num_logits=len(drafted) + 1))
    return _verify(drafted, draft_probs, target_logits, processing.do_sample, generator)


def _verify(drafted: list[int], draft_probs: list[torch.Tensor], target_logits: torch.Tensor, do_sample: bool,
            generator: torch.Generator | None) -> tuple[int, int]:
    """The acceptance test on the target's processed logits `[k + 1, vocab]`: (accepted count, the target's token).
    Greedy: while the argmax agrees; sampling: `min(1, p_i / q_i)`, a rejection resampled from the residual."""
    if not do_sample:
        target_tokens = target_logits.argmax(-1).tolist()
        num_accepted = 0
        while num_accepted < len(drafted) and drafted[num_accepted] == target_tokens[num_accepted]:
            num_accepted += 1
        return num_accepted, target_tokens[num_accepted]
    target_probs = target_logits.softmax(-1)
    for i, (token, q) in enumerate(zip(drafted, draft_probs)):
        p = target_probs[i]
        uniform = torch.rand((), generator=generator, device=p.device)
        if uniform * q[token] >= p[token]:  # rejected: P(accept) = min(1, p / q)
            return i, int(sample(residual_distribution(p, q)[None], generator))
    return len(drafted), int(sample(target_probs[-1:], generator))


def _draft_correct(target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor,
                   settings: DecodingSettings, processing: Processing) -> list[bool]:
    """Whether the draft's greedy proposal, teacher-forced on the target's greedy output, is the target's token."""
    reference = decode(target, None, input_ids, replace(settings, schedule="none", head=None, compile=False),
                       processing=processing).sequences
    with torch.inference_mode():
        logits = draft(input_ids=reference).logits[0, input_ids.shape[1] - 1: -1]
        proposals = processing.logits(reference[0, :-1].tolist(), logits).argmax(-1)
    return (proposals == reference[0, input_ids.shape[1]:]).tolist()


def _check_attention_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
    """ValueError unless `attention_mask` (when given) has `input_ids`' shape and is all ones."""
    if attention_mask is None:
        return
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}")
    if attention_mask.dim() == 1:
        attention_mask = attention_mask[None]
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has shape "
                         f"{tuple(input_ids.shape)}")
    if not bool((attention_mask == 1).all()):
        raise ValueError("attention_mask holds zeros (padding): speculative_generate decodes one prompt without "
                         "padding; pass the prompt alone (tokenizer(text, return_tensors='pt'), no padding=...)")


def _priced_on(settings: DecodingSettings) -> str | None:
    """Where the step times that chose an `auto` threshold were timed (None: a threshold stored without any)."""
    if settings.step_times is not None:
        times, source = settings.step_times.as_dict(), "given"
    else:
        times, source = (settings.head.threshold_selection or {}).get("judged_step_times") or {}, "stored with the head"
    threads = f", {times.get('threads')} thread(s)" if times.get("device") == "cpu" else ""
    processor = f", {times['processor']}" if times.get("processor") else ""
    return f"{times.get('device')} {times.get('engine', 'eager')}{threads}{processor} ({source})" if times else None


def _check_input_ids(input_ids: torch.LongTensor) -> torch.LongTensor:
    """`input_ids` as `[1, length]`, or an error naming what is wrong with it."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.long, torch.int, torch.int16):
        raise TypeError(f"input_ids must be an integer torch.Tensor, got {type(input_ids).__name__}"
                        + (f" of {input_ids.dtype}" if isinstance(input_ids, torch.Tensor) else ""))
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"batch size must be 1 (input_ids of shape [1, length]), got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token")
    return input_ids
