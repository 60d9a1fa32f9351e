"""What decoding costs on this machine: the measured step times behind every predicted time.

A speculative round that drafts `k` tokens costs

    verify(k) + draft(1) + ... + draft(k) + judged * judge + round_overhead

- `verify(k)`: the target's forward over `[last verified token, y_1..y_k]` and the acceptance test;
  on a GPU nearly flat in `k`, on a CPU it grows with the tokens checked;
- `draft(j)`: the round's `j`-th draft step (forward, softmax, the token's choice). A verification
  pushes the draft's weights out of the CPU's caches, so a round's first draft steps cost more
  than its later ones;
- `judge`: the acceptance head's judgement of one drafted token (`ada` only);
- `round_overhead`: the loop's own work per round beyond those steps (cache crops, bookkeeping).

A generation without a draft costs `target_alone` per token: back-to-back target steps, whose
weights stay in the caches. The first round also reads the prompt: its first draft step and its
verification are prefill forwards, priced apart by `prefill_extra_ms`. Every figure is timed through the engine's own step
functions (`decoding.draft_step`, `decoding.verify`, the schedule's `stop_after`) in rounds laid
out as the loop lays them out, so that the cache state each step meets is the loop's. `StepTimes`
prices the counts of a generation (`predicted_ms`) and the replayed rounds of the threshold choice
(`specdecpp.threshold`) alike; its unit for cost per token is one target-alone step.
"""
from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedModel

from specdecpp.decoding import CachedModel, decode, draft_step, verify
from specdecpp.decoding_settings import DecodingSettings
from specdecpp.head import AcceptancePredictionHead
from specdecpp.sampling import make_warpers
from specdecpp.schedules import Ada


@dataclass
class StepTimes:
    """Median times (ms) of each kind of step the loop takes (see the module docstring), and where
    they were measured. `verify_ms[k]` is a verification of `k` drafted tokens (`k = 0`: a
    target-alone step); `judge_ms` is 0 for decoding without a head."""

    draft_ms: list[float]
    verify_ms: list[float]
    target_alone_ms: float
    judge_ms: float = 0.0
    round_overhead_ms: float = 0.0
    device: str = "cpu"
    threads: int = 1
    repeats: int = 0

    def __post_init__(self):
        self._drafting_ms = [0.0] + list(itertools.accumulate(self.draft_ms))

    def round_ms(self, drafted: int, judged: int = 0) -> float:
        """The time of one round that drafts `drafted` tokens of which the head judges `judged`
        (steps past the longest measured round cost as much as its last)."""
        longest = len(self.draft_ms)
        drafting = self._drafting_ms[min(drafted, longest)] + max(drafted - longest, 0) * (self.draft_ms or [0.0])[-1]
        return self.verify_ms[min(drafted, len(self.verify_ms) - 1)] + drafting + judged * self.judge_ms \
            + self.round_overhead_ms

    def predicted_ms(self, draft_lengths: list[int], judged: int = 0, with_draft: bool = True) -> float:
        """The time that a generation's rounds (`draft_lengths`, one entry per round) and its
        `judged` head judgements cost, prefill left out (see `prefill_extra_ms`); without a draft
        (`with_draft=False`) every round is a target-alone step."""
        if not with_draft:
            return len(draft_lengths) * self.target_alone_ms
        return sum(self.round_ms(k) for k in draft_lengths) + judged * self.judge_ms

    def as_dict(self) -> dict:
        """The figures as a JSON-ready dict (what a head's threshold selection stores)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def judged_tokens(draft_lengths: list[int], alignment: str | None) -> int:
    """How many drafted tokens the head judges over rounds of `draft_lengths`: every one for a
    `proposer` head, all but each round's first for a `reader` head, none without a head."""
    if alignment == "proposer":
        return sum(draft_lengths)
    if alignment == "reader":
        return sum(max(k - 1, 0) for k in draft_lengths)
    return 0


def measure_costs(target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor, max_draft: int,
                  head: AcceptancePredictionHead | None = None, do_sample: bool = False,
                  repeats: int = 8) -> tuple[StepTimes, StepTimes | None]:
    """The pair's step times on the context `input_ids` `[1, length]`: those of schedules without a
    head (the loop's own overhead per round included, see `measure_round_overhead`) and, given a
    `head`, those of `ada` with it (its draft steps also return hidden states and each is judged, which changes what
    the next step finds in the CPU caches; same round overhead). The two probes alternate pass by
    pass, so that load on the machine hits both alike. Greedy steps unless `do_sample`."""
    probes = [StepProbe(target, draft, input_ids, max_draft, do_sample=do_sample)]
    if head is not None:
        probes.append(StepProbe(target, draft, input_ids, max_draft, head=head, do_sample=do_sample))
    for _ in range(repeats):
        for probe in probes:
            probe.sample()
    plain = probes[0].times()
    plain.round_overhead_ms = measure_round_overhead(target, draft, input_ids)
    judged = replace(probes[1].times(), round_overhead_ms=plain.round_overhead_ms) if head is not None else None
    return plain, judged


class StepProbe:
    """Times the loop's steps on the context `input_ids` `[1, length]` kept in both KV caches, one
    pass at a time (`sample`), so that an evaluation can spread its timing over a run and machine
    load hits it as it hits the methods. A pass takes `max_draft + 1` target-alone steps back to
    back, then rounds of every length `k = 0..max_draft` as the loop takes them (each drafted token
    judged by `head` when given), timing each draft step, judgement and verification apart, and
    crops both caches back so that every round sees the same context. Greedy steps unless
    `do_sample` (warpers of temperature 1, no filtering); `warmup` passes run untimed."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor, max_draft: int,
                 head: AcceptancePredictionHead | None = None, do_sample: bool = False, warmup: int = 2):
        self.seq, self.max_draft, self.has_head = input_ids[0].tolist(), max_draft, head is not None
        self.device = str(target.device)
        self.warpers = make_warpers() if do_sample else None
        self.generator = torch.Generator(target.device).manual_seed(0) if do_sample else None
        self.judge = Ada(head, stop_threshold=1.0, bound=(1, max(max_draft, 1))) if head is not None else None
        self.target_model, self.draft_model = CachedModel(target), CachedModel(draft)
        self.drafts = [[] for _ in range(max_draft)]
        self.verified = [[] for _ in range(max_draft + 1)]
        self.alone, self.judged, self.passes = [], [], 0
        with torch.inference_mode():
            for model in (self.target_model, self.draft_model):
                model.forward(self.seq, num_logits=1)
                model.crop(len(self.seq) - 1)  # as between rounds: everything but the last verified token
            for _ in range(warmup):
                self._pass()

    def sample(self, passes: int = 1) -> None:
        """Time `passes` more passes."""
        with torch.inference_mode():
            for _ in range(passes):
                alone, drafts, verified, judged = self._pass()
                self.alone += alone
                self.judged += judged
                for times, ms in zip(self.drafts + self.verified, drafts + verified):
                    times += ms
                self.passes += 1

    def times(self) -> StepTimes:
        """The medians of every pass so far, as a `StepTimes` (no round overhead: see `measure_costs`)."""
        median = statistics.median
        return StepTimes(draft_ms=[median(t) for t in self.drafts], verify_ms=[median(v) for v in self.verified],
                         target_alone_ms=median(self.alone), judge_ms=median(self.judged) if self.has_head else 0.0,
                         device=self.device, threads=torch.get_num_threads(), repeats=self.passes)

    def _pass(self) -> tuple[list[float], list[list[float]], list[list[float]], list[float]]:
        seq, warpers, generator, judge = self.seq, self.warpers, self.generator, self.judge
        alone, drafts, verified, judged = [], [[] for _ in range(self.max_draft)], [], []
        for _ in range(self.max_draft + 1):  # target-alone steps, back to back as in a target-alone decode
            start = time.perf_counter()
            verify(self.target_model, seq, [], [], warpers, generator)
            self.target_model.crop(len(seq) - 1)
            alone.append(1000 * (time.perf_counter() - start))
        for k in range(self.max_draft + 1):
            drafted, draft_probs = [], []
            if judge is not None:
                judge.max_draft()
            for j in range(1, k + 1):
                start = time.perf_counter()
                step = draft_step(self.draft_model, seq + drafted, j, warpers, generator, judge is not None)
                middle = time.perf_counter()
                if judge is not None:
                    judge.stop_after(step)
                drafts[j - 1].append(1000 * (middle - start))
                judged.append(1000 * (time.perf_counter() - middle))
                drafted.append(step.token)
                if warpers is not None:
                    draft_probs.append(step.probs)
            start = time.perf_counter()
            verify(self.target_model, seq, drafted, draft_probs, warpers, generator)
            self.target_model.crop(len(seq) - 1)
            self.draft_model.crop(len(seq) - 1)
            verified.append([1000 * (time.perf_counter() - start)])
        return alone, drafts, verified, judged


def prefill_extra_ms(target: PreTrainedModel, draft: PreTrainedModel | None, input_ids: torch.LongTensor,
                     times: StepTimes) -> float:
    """What a generation's first round costs beyond its priced steps because it reads the prompt:
    a forward over the prompt on each model (fresh caches, timed now) less the draft step and
    target-alone verification it stands in for. `draft=None`: the target alone."""
    if draft is None:
        return _prefill_ms(target, input_ids) - times.target_alone_ms
    extra = _prefill_ms(target, input_ids) - times.verify_ms[0]
    if times.draft_ms:
        extra += _prefill_ms(draft, input_ids) - times.draft_ms[0]
    return extra


def _prefill_ms(model: PreTrainedModel, input_ids: torch.LongTensor) -> float:
    cached = CachedModel(model)
    with torch.inference_mode():
        start = time.perf_counter()
        cached.forward(input_ids[0].tolist(), num_logits=1)
        return 1000 * (time.perf_counter() - start)


def loop_overhead_ms(stats) -> float:
    """The loop's own time per round (ms) in one generation's `GenerationStats`: its wall time
    less the time inside draft steps, verifications and stop decisions, over its rounds."""
    own = stats.wall_time - stats.draft_time - stats.verify_time - stats.schedule_time
    return 1000 * own / max(stats.target_calls, 1)


def measure_round_overhead(target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor,
                           tokens: int = 32, runs: int = 3) -> float:
    """The loop's own time per round (ms, `loop_overhead_ms`) in a `constant` K=3 decode of
    `tokens` tokens after `input_ids`; the median of `runs`."""
    settings = DecodingSettings(schedule="constant", num_assistant_tokens=3, max_new_tokens=tokens, eos_token_id=[])
    return statistics.median(loop_overhead_ms(decode(target, draft, input_ids, settings).stats) for _ in range(runs))
