"""The speculative decoding loop (Leviathan et al. 2023; Chen et al. 2023) with pluggable
candidate-length schedules, SpecDec++'s `ada` among them.

One round: the draft proposes `y_1..y_k` one token per forward (the schedule decides `k`), the
target scores `[last verified token, y_1..y_k]` in one forward, the longest acceptable prefix is
kept plus one token from the target, and both KV caches are cropped back to what was kept.
Greedy keeps exactly the target's argmax tokens; sampling keeps exactly the target's distribution.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
from transformers import LogitsProcessorList, PreTrainedModel, StoppingCriteriaList

from specdecpp.checks import eos_ids, generation_eos, trim_at_eos
from specdecpp.compat import ModelOutput
from specdecpp.costs import StepTimes
from specdecpp.engine.compiled import CompiledDraft, ProcessedDraft, StaticModel, compiled_models, recompiles_forbidden
from specdecpp.engine.draft_step import CachedModel, EagerDraft, draft_steps
from specdecpp.engine.online import OnlineAcceptanceEstimator
from specdecpp.engine.processing import Processing, build_processing
from specdecpp.engine.sampling import residual_distribution, sample
from specdecpp.engine.schedules import Schedule, make_schedule
from specdecpp.engine.settings import DecodingSettings, default_schedule
from specdecpp.head.model import AcceptancePredictionHead


@dataclass
class GenerationStats:
    """Counts for one generation. `target_calls` and `draft_calls` are forward passes (the
    first of each also reads the prompt); `accepted_lengths` holds, per round, how many drafted
    tokens the target accepted, `draft_lengths` how many were drafted and `verified_lengths` how
    many of those the target verified (all, but for `verify-budget` and `ada-budget`);
    `discarded_tokens` is how many drafted tokens were not kept (rejected, or never verified).
    Without an EOS or a stopping criterion inside the last round,
    `generated_length == sum(accepted_lengths) + len(accepted_lengths)`.
    Where the time went (seconds): `draft_time` in draft steps, `verify_time` in the target's
    verifications, `schedule_time` in the schedule's stop decisions (`ada`'s judgements); the rest
    of `wall_time` is the loop's own work. `compile_time` is what this call spent compiling the
    compiled engine's graphs (`compile=True`, first use per model pair and process), outside `wall_time`."""

    target_calls: int = 0
    draft_calls: int = 0
    discarded_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    draft_lengths: list[int] = field(default_factory=list)
    verified_lengths: list[int] = field(default_factory=list)
    generated_length: int = 0
    wall_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    schedule_time: float = 0.0
    compile_time: float = 0.0


@dataclass
class SpeculativeOutput(ModelOutput):
    """`sequences`: `[1, prompt + generated]` token ids; `stats`: a `GenerationStats`. A `transformers`
    `ModelOutput`: `out.sequences`, `out["sequences"]` and `out[0]` are the same tensor."""

    sequences: torch.LongTensor | None = None
    stats: GenerationStats | None = None


def speculative_generate(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    input_ids: torch.LongTensor,
    *,
    attention_mask: torch.Tensor | None = None,
    schedule: str | None = None,
    head: AcceptancePredictionHead | None = None,
    stop_threshold: float | str = 0.3,
    bound: tuple[int, int] = (2, 20),
    num_assistant_tokens: int = 5,
    assistant_confidence_threshold: float = 0.4,
    online: bool = False,
    estimator: OnlineAcceptanceEstimator | None = None,
    step_times: StepTimes | None = None,
    max_new_tokens: int = 128,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    streamer=None,
    compile: bool = False,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    tokenizer=None,
    **processing_fields,
) -> SpeculativeOutput:
    """Generate from `target` with `draft` proposing candidates, the candidate length chosen by
    `schedule` (one of `none`, `constant`, `heuristic`, `dynamic`, `ada`, `online`, `oracle`,
    `verify-budget`, `ada-budget`; see `specdecpp.engine.schedules`); `ada` reads `head` and takes
    `stop_threshold="auto"` for the threshold stored in the head, and with `online=True`
    recalibrates the head's logit from the rounds' outcomes; `online` is vLLM's online acceptance
    estimator under the same stop rule. Both learn in `estimator` (a
    `specdecpp.engine.online.OnlineAcceptanceEstimator`, which then carries what it learned to the next
    call) or, without one, in a fresh one for this generation. `verify-budget` (vLLM's adaptive
    verification, greedy only) drafts blocks of `num_assistant_tokens` scored by that estimator and
    verifies the prefix worth its price at `step_times` (a `specdecpp.costs.StepTimes`; default:
    those stored with `head`'s threshold); `ada-budget` does the same with a proposer `head`'s
    scores. Greedy output equals `target.generate(do_sample=False)` token for token; sampled output (temperature, top-k,
    top-p applied to both models) follows the target's distribution, reproducibly given
    `generator`. `processing_fields`: `generate`'s fields that
    add logits processors (`repetition_penalty`, `no_repeat_ngram_size`, `min_new_tokens`,
    `min_length`, `bad_words_ids`, `suppress_tokens`, `begin_suppress_tokens`, `sequence_bias`,
    `forced_eos_token_id`) or stopping criteria (`stop_strings`, which needs `tokenizer`,
    `max_time`); `logits_processor` and `stopping_criteria` add the caller's own, as in `generate`.
    Both models' logits are processed at every position with the prefix it has
    (`specdecpp.engine.processing`), so the output is still `target.generate`'s with the same settings.
    Generation stops at EOS (the target's generation config's, or `eos_token_id`), after
    `max_new_tokens` or at the first token a stopping criterion is met by. `streamer` (a
    `transformers` `TextStreamer` or anything with `put`/`end`) receives tokens as rounds end.
    Batch size 1, so `**tokenizer(text, return_tensors="pt")` works: `attention_mask` is accepted and
    must be all ones (padding is refused). `schedule=None` means `ada` when a `head` is given, else
    `dynamic` (what `target.generate(assistant_model=draft)` does) with a draft, else `none`.
    `compile=True` runs the compiled engine (`specdecpp.engine.compiled`: static KV caches, each step one
    `torch.compile`d graph, compiled on first use per model pair and process): the same tokens,
    faster steps. Returns a `SpeculativeOutput`: the sequences (prompt included) and a `GenerationStats`."""
    settings = DecodingSettings(
        schedule=schedule, head=head, stop_threshold=stop_threshold, bound=bound,
        num_assistant_tokens=num_assistant_tokens, assistant_confidence_threshold=assistant_confidence_threshold,
        online=online, estimator=estimator, step_times=step_times, max_new_tokens=max_new_tokens,
        do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
        eos_token_id=eos_token_id, compile=compile, logits_processor=logits_processor,
        stopping_criteria=stopping_criteria, **processing_fields)
    return decode(target, draft, input_ids, settings, attention_mask=attention_mask, generator=generator,
                  streamer=streamer, tokenizer=tokenizer)


def decode(target: PreTrainedModel, draft: PreTrainedModel | None, input_ids: torch.LongTensor,
           settings: DecodingSettings, *, attention_mask: torch.Tensor | None = None,
           generator: torch.Generator | None = None, streamer=None, tokenizer=None,
           processing: Processing | None = None) -> SpeculativeOutput:
    """`speculative_generate` with its decoding settings in one `DecodingSettings` (what
    evaluation and the `generate` integration pass): validated, checked against the models, then
    decoded. `processing`: the processors and criteria `generate` already built (the `generate`
    integration), else built here from `settings` as `generate` would (stop strings need the
    `tokenizer`). Returns a `SpeculativeOutput`."""
    if settings.schedule is None:
        settings = replace(settings, schedule=default_schedule(draft, settings.head))
    input_ids = _check_input_ids(input_ids)
    settings.validate()
    settings.check_models(target, draft)
    _check_attention_mask(input_ids, attention_mask)
    schedule, max_new_tokens = settings.schedule, settings.max_new_tokens
    eos = eos_ids(generation_eos(target) if settings.eos_token_id is None else settings.eos_token_id)
    seq = input_ids[0].tolist()
    prompt_length = len(seq)
    if processing is None:
        processing = build_processing(target, settings.generation_config(prompt_length, eos), input_ids,
                                      settings.logits_processor, settings.stopping_criteria, tokenizer)
    draft_correct = _draft_correct(target, draft, input_ids, settings, processing) if schedule == "oracle" else None
    policy = make_schedule(settings, draft_correct=draft_correct)

    stats = GenerationStats()
    target_model, draft_model, stats.compile_time = step_models(
        target, draft if schedule != "none" else None, settings, processing, policy.needs_hidden_states,
        prompt_length + max_new_tokens)
    start = time.perf_counter()
    if streamer is not None:
        streamer.put(input_ids.cpu())
    with torch.inference_mode(), recompiles_forbidden(settings.compile):
        while (remaining := max_new_tokens - (len(seq) - prompt_length)) > 0:
            # A round emits up to k + 1 tokens, so never draft past the length limit.
            policy.start_round()
            drafted, draft_probs = draft_round(draft_model, seq, policy, min(policy.max_draft(), remaining - 1),
                                          processing.do_sample, generator, stats)
            num_drafted = len(drafted)
            # The target verifies what the schedule says (all, but a budget schedule's prefix); the
            # rest were drafted, paid for and are discarded, and the draft's cache is cropped below.
            num_verified = policy.verify_length(num_drafted)
            drafted, draft_probs = drafted[:num_verified], draft_probs[:num_verified]
            verify_start = time.perf_counter()
            num_accepted, next_token = verify(target_model, seq, drafted, draft_probs, processing, generator)
            stats.verify_time += time.perf_counter() - verify_start
            stats.target_calls += 1
            stats.accepted_lengths.append(num_accepted)
            stats.draft_lengths.append(num_drafted)
            stats.verified_lengths.append(num_verified)
            stats.discarded_tokens += num_drafted - num_accepted
            policy.end_round(num_verified, num_accepted)
            new_tokens = trim_at_eos(drafted[:num_accepted] + [next_token], eos)
            stop = processing.stop_length(seq, new_tokens)
            new_tokens = new_tokens[:stop]
            seq += new_tokens
            # Both caches keep everything but the last token, which the next round feeds.
            target_model.crop(len(seq) - 1)
            if draft_model is not None:
                draft_model.crop(len(seq) - 1)
            if streamer is not None:
                streamer.put(torch.tensor(new_tokens))
            if stop is not None or new_tokens[-1] in eos:
                break
    if streamer is not None:
        streamer.end()
    stats.generated_length = len(seq) - prompt_length
    stats.wall_time = time.perf_counter() - start
    return SpeculativeOutput(torch.tensor([seq], dtype=torch.long, device=input_ids.device), stats)


def step_models(target: PreTrainedModel, draft: PreTrainedModel | None, settings: DecodingSettings,
                processing: Processing, with_hidden_states: bool, max_length: int
                ) -> tuple[CachedModel | StaticModel, EagerDraft | CompiledDraft | ProcessedDraft | None, float]:
    """The target and (unless None) the draft as the loop steps them, with empty caches for a
    generation of up to `max_length` tokens: eager (`CachedModel`, and an `EagerDraft` proposing
    under `processing` whose steps return the hidden state a head reads when `with_hidden_states`),
    or with `settings.compile` the compiled engine's (`specdecpp.engine.compiled`: its draft step also
    judges with `ada`'s head, or, under processors that read the prefix, runs the forward alone as a
    graph and the rest as the eager draft does). Returns them and the seconds spent compiling."""
    if not settings.compile:
        return CachedModel(target), EagerDraft(draft, processing, with_hidden_states) if draft else None, 0.0
    return compiled_models(target, draft, settings, max_length, processing, with_hidden_states)


def draft_round(draft_model: EagerDraft | CompiledDraft | ProcessedDraft | None, seq: list[int], policy: Schedule,
                max_tokens: int, do_sample: bool, generator: torch.Generator | None, stats: GenerationStats
                ) -> tuple[list[int], list[torch.Tensor]]:
    """Draft up to `max_tokens` tokens after `seq`, one draft forward each, until the policy
    stops: the drafting half of a round (`draft_rounds` for one request). Returns the tokens and,
    when sampling, the draft's distribution for each."""
    return draft_rounds([draft_model], [seq], [policy], [max_tokens], do_sample, generator, stats)[0]


def draft_rounds(drafts: list[EagerDraft | CompiledDraft | ProcessedDraft], seqs: list[list[int]],
                 policies: list[Schedule], max_tokens: list[int], do_sample: bool, generator: torch.Generator | None,
                 stats: GenerationStats) -> list[tuple[list[int], list[torch.Tensor]]]:
    """The drafting half of the rounds of several requests at once (the loop's one request; a
    vLLM batch, `specdecpp.serving.vllm`): request `i` drafts up to `max_tokens[i]` tokens after
    `seqs[i]` with `drafts[i]`, until `policies[i]` stops it (the caller has started each policy's
    round, `Schedule.start_round`). Each request's first step runs alone (it feeds what its draft
    has not seen yet); then the requests still drafting step together (`draft_steps`). Returns,
    per request, the tokens and, when sampling, the draft's distribution for each."""
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


def verify(target_model: CachedModel | StaticModel, seq: list[int], drafted: list[int],
           draft_probs: list[torch.Tensor], processing: Processing, generator: torch.Generator | None
           ) -> tuple[int, int]:
    """One target forward over `[last verified token, drafted...]` after `seq`, each position's
    logits processed with its own prefix, then `_verify`: how many drafted tokens are accepted and
    the token the target adds after them."""
    tokens = seq + drafted
    target_logits, _ = target_model.forward(tokens, num_logits=len(drafted) + 1)
    return _verify(drafted, draft_probs, processing.logits(tokens, target_logits), processing.do_sample, generator)


def _verify(drafted: list[int], draft_probs: list[torch.Tensor], target_logits: torch.Tensor, do_sample: bool,
            generator: torch.Generator | None) -> tuple[int, int]:
    """Given the target's processed logits `[k + 1, vocab]` at `[last verified, y_1..y_k]`, return
    how many drafted tokens are accepted and the token the target adds after them. Greedy: accept
    while the target's argmax agrees. Sampling: accept `y_i` with probability `min(1, p_i / q_i)`,
    resample the first rejection from `normalize(max(0, p - q))`, or sample `p_{k+1}` if none."""
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
    """For the oracle: the target's greedy continuation under `settings` and `processing`, then
    whether the draft's greedy proposal (teacher-forced on that continuation, processed alike) is
    right at each generated position. This look-ahead is the oracle's knowledge, not counted in
    its stats."""
    reference = decode(target, None, input_ids, replace(settings, schedule="none", head=None, compile=False),
                       processing=processing).sequences
    generated = reference[0, input_ids.shape[1]:]
    with torch.inference_mode():
        logits = draft(input_ids=reference).logits[0, input_ids.shape[1] - 1: -1]
        proposals = processing.logits(reference[0, :-1].tolist(), logits).argmax(-1)
    return (proposals == generated).tolist()


def _check_attention_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
    """ValueError unless `attention_mask` (when given) has the shape of `input_ids` (`[1, length]`)
    and is all ones: the loop decodes one prompt without padding."""
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


def _check_input_ids(input_ids: torch.LongTensor) -> torch.LongTensor:
    """Fail at once, with a message naming the problem, on a prompt the loop cannot take (not an
    integer tensor, a batch of several, empty). Returns `input_ids` as `[1, length]`."""
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
