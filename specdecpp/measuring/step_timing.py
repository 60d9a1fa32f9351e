"""Timing the loop's steps on this machine: the measured `StepTimes` that price the cost model,
and the steps behind the flat view's cost ratio `c` (`EngineSteps`, which `CostProbe` times).

Every figure is timed through the engine's own step functions, eager or compiled as the decoding
will run (`decoding.step_models`: the draft's `draft_step`, `decoding.verify`, the schedule's
`stop_after`); `StepProbe` takes its rounds through the loop's own `decoding.draft_round` and
`decoding.verify`, so that the cache state each step meets is the loop's and each step is timed
as the loop times it (see `specdecpp.costs` for what each figure prices). The first round of a
generation also reads the prompt: its first draft step and its verification are prefill forwards,
priced apart by `prefill_extra_ms`.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch
from transformers import PreTrainedModel

from specdecpp.costs import StepTimes, busy_machine, cost_ratio, fit_verify_ms, loop_overhead_ms, pass_spread
from specdecpp.engine.decoding import GenerationStats, decode, draft_round, step_models, verify
from specdecpp.engine.draft_step import DraftStep
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.schedules import Ada, Schedule
from specdecpp.engine.settings import DecodingSettings
from specdecpp.head.model import AcceptancePredictionHead


def measure_costs(target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor, max_draft: int,
                  head: AcceptancePredictionHead | None = None, do_sample: bool = False,
                  repeats: int = 8, compile: bool = False) -> tuple[StepTimes, StepTimes | None]:
    """The pair's step times on the context `input_ids` `[1, length]`: those of schedules without a
    head (the loop's own overhead per round included, see `measure_round_overhead`) and, given a
    `head`, those of `ada` with it (its draft steps also return hidden states and each is judged, which changes what
    the next step finds in the CPU caches; same round overhead). The two probes alternate pass by
    pass, so that load on the machine hits both alike. Greedy steps unless `do_sample`; the
    compiled engine's steps when `compile` (the engine the decoding will run)."""
    probes = [StepProbe(target, draft, input_ids, max_draft, do_sample=do_sample, compile=compile)]
    if head is not None:
        probes.append(StepProbe(target, draft, input_ids, max_draft, head=head, do_sample=do_sample, compile=compile))
    for _ in range(repeats):
        for probe in probes:
            probe.sample()
    plain = probes[0].times()
    plain.round_overhead_ms = measure_round_overhead(target, draft, input_ids, compile=compile)
    judged = replace(probes[1].times(), round_overhead_ms=plain.round_overhead_ms) if head is not None else None
    return plain, judged


class StepProbe:
    """Times the loop's steps on the context `input_ids` `[1, length]` kept in both KV caches, one
    pass at a time (`sample`), so that an evaluation can spread its timing over a run and machine
    load hits it as it hits the methods. A pass takes `max_draft + 1` target-alone steps back to
    back, then rounds of every length `k = 0..max_draft` through the loop's own `draft_round` and
    `verify` (each drafted token judged by `head` when given, `TimedRound`), timing each draft step,
    judgement and verification apart, and crops both caches back so that every round sees the same
    context. Greedy steps unless `do_sample` (warpers of temperature 1, no filtering); the compiled
    engine's steps when `compile` (its draft step then includes the judgement); `warmup` passes run
    untimed."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor, max_draft: int,
                 head: AcceptancePredictionHead | None = None, do_sample: bool = False, warmup: int = 2,
                 compile: bool = False):
        self.seq, self.max_draft, self.has_head = input_ids[0].tolist(), max_draft, head is not None
        self.device, self.engine = str(target.device), "compiled" if compile else "eager"
        self.processing = sampling_only(do_sample)
        self.generator = torch.Generator(target.device).manual_seed(0) if do_sample else None
        self.judge = Ada(head, stop_threshold=1.0, bound=(1, max(max_draft, 1))) if head is not None else None
        self.models = lambda: step_models(target, draft, DecodingSettings(
            schedule="ada" if head is not None else "constant", head=head, do_sample=do_sample, compile=compile),
            self.processing, head is not None, len(self.seq) + max_draft + 1)[:2]
        self.compiled = compile
        self.drafts = [[] for _ in range(max_draft)]
        self.verified = [[] for _ in range(max_draft + 1)]
        self.alone, self.judged, self.passes = [], [], 0
        self._load()
        with torch.inference_mode():
            for _ in range(warmup):
                self._pass()

    def _load(self) -> None:
        """The models with the context in their caches (`loaded_models`)."""
        self.target_model, self.draft_model = loaded_models(self.models, self.seq, self.generator)

    def sample(self, passes: int = 1) -> None:
        """Time `passes` more passes."""
        if self.compiled:
            self._load()
        with torch.inference_mode():
            for _ in range(passes):
                alone, drafts, verified, judged = self._pass()
                self.alone += alone
                self.judged += judged
                for times, ms in zip(self.drafts + self.verified, drafts + verified):
                    times += ms
                self.passes += 1

    def times(self) -> StepTimes:
        """The medians of every pass so far, as a `StepTimes` (no round overhead: see `measure_costs`),
        verifications fitted over lengths (`fit_verify_ms`, the medians kept beside), with the spread
        between the passes' verifications (`pass_spread`, each length timed once per pass): a warning
        and `busy` when it says the machine was busy."""
        median = statistics.median
        verify_ms, spread = [median(v) for v in self.verified], pass_spread(self.verified)
        return StepTimes(draft_ms=[median(t) for t in self.drafts], verify_ms=fit_verify_ms(verify_ms),
                         target_alone_ms=median(self.alone), judge_ms=median(self.judged) if self.has_head else 0.0,
                         device=self.device, threads=torch.get_num_threads(), repeats=self.passes, engine=self.engine,
                         verify_ms_measured=verify_ms, spread=spread,
                         busy=busy_machine(spread, f"the {self.engine} engine's steps"))

    def _pass(self) -> tuple[list[float], list[list[float]], list[list[float]], list[float]]:
        seq, processing, generator = self.seq, self.processing, self.generator
        alone, drafts, verified, judged = [], [[] for _ in range(self.max_draft)], [], []
        for _ in range(self.max_draft + 1):  # target-alone steps, back to back as in a target-alone decode
            start = time.perf_counter()
            verify(self.target_model, seq, [], [], processing, generator)
            self.target_model.crop(len(seq) - 1)
            alone.append(1000 * (time.perf_counter() - start))
        for k in range(self.max_draft + 1):
            stats = GenerationStats()
            policy = TimedRound(k, self.judge, stats)
            policy.start_round()
            drafted, draft_probs = draft_round(self.draft_model, seq, policy, k, processing.do_sample, generator, stats)
            for j, (draft_ms, judge_ms) in enumerate(policy.step_ms()):
                drafts[j].append(draft_ms)
                judged.append(judge_ms)
            start = time.perf_counter()
            verify(self.target_model, seq, drafted, draft_probs, processing, generator)
            self.target_model.crop(len(seq) - 1)
            self.draft_model.crop(len(seq) - 1)
            verified.append([1000 * (time.perf_counter() - start)])
        return alone, drafts, verified, judged


class TimedRound(Schedule):
    """A probe's round as the loop drafts it (`decoding.draft_round`): exactly `k` tokens, each
    judged by `judge` when given (`ada`'s rule; the judgement is timed and its decision ignored).
    The loop adds each draft step's time and its stop decision's to `stats` after that decision, so
    the running totals read at each `stop_after` and once after the round, differenced, are each
    step's times as the loop measures them (`step_ms`)."""

    def __init__(self, k: int, judge: Ada | None, stats: GenerationStats):
        self.k, self.judge, self.stats = k, judge, stats
        self.totals = []

    def start_round(self) -> None:
        """No step timed yet; the judge's product starts afresh."""
        self.totals = []
        if self.judge is not None:
            self.judge.start_round()

    def max_draft(self) -> int:
        """The round's length, `k`."""
        return self.k

    def stop_after(self, step: DraftStep) -> bool:
        """Read the totals before this step's (the loop adds them after), judge `step`, go on."""
        self.totals.append((self.stats.draft_time, self.stats.schedule_time))
        if self.judge is not None:
            self.judge.stop_after(step)
        return False

    def step_ms(self) -> list[tuple[float, float]]:
        """`(draft step, judgement)` in ms for each drafted token, once the round is drafted."""
        totals = self.totals + [(self.stats.draft_time, self.stats.schedule_time)]
        return [(1000 * (after[0] - before[0]), 1000 * (after[1] - before[1]))
                for before, after in zip(totals, totals[1:])]


def loaded_models(models, seq: list[int], generator: torch.Generator | None = None) -> tuple:
    """The target and draft `models()` builds (`decoding.step_models`), with the context `seq` in
    their caches as between rounds: everything but the last verified token, which the next step
    feeds. The compiled engine's models are shared with generations, which empty them, so timing
    loads them again before it samples."""
    target_model, draft_model = models()
    with torch.inference_mode():
        target_model.forward(seq, num_logits=1)
        draft_model.draft_step(seq, 1, generator)
    target_model.crop(len(seq) - 1)
    draft_model.crop(len(seq) - 1)
    return target_model, draft_model


class EngineSteps:
    """The steps the flat view's cost ratio `c` divides (`CostProbe` times them): one draft
    step feeding the context's last token and one verification of it and `k` drafted tokens,
    greedy, through the engine the decoding runs (eager, or compiled when `compile`), each leaving
    the caches as it found them. `load` puts the context back in the compiled engine's caches,
    which generations empty (eager models keep theirs)."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor, k: int,
                 compile: bool = False):
        self.seq, self.k, self.compiled = input_ids[0].tolist(), k, compile
        self.processing = sampling_only(False)
        self.models = lambda: step_models(target, draft, DecodingSettings(compile=compile), self.processing, False,
                                          len(self.seq) + k + 1)[:2]
        self.target_model, self.draft_model = loaded_models(self.models, self.seq)

    def load(self) -> None:
        """The context back in the compiled engine's caches (nothing to do for eager models)."""
        if self.compiled:
            self.target_model, self.draft_model = loaded_models(self.models, self.seq)

    def draft_step(self) -> None:
        """One draft step feeding the context's last token."""
        with torch.inference_mode():
            self.draft_model.draft_step(self.seq, 1, None)
        self.draft_model.crop(len(self.seq) - 1)

    def verify(self) -> None:
        """One verification of the context's last token and `k` drafted ones (`decoding.verify`)."""
        with torch.inference_mode():
            verify(self.target_model, self.seq, self.seq[-1:] * self.k, [], self.processing, None)
        self.target_model.crop(len(self.seq) - 1)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with `threads` torch CPU threads (0: as they are), then set them back: step
    times hold only for the thread count they were timed with, which should be the decoding's."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def prefill_extra_ms(target: PreTrainedModel, draft: PreTrainedModel | None, input_ids: torch.LongTensor,
                     times: StepTimes, compile: bool = False) -> float:
    """What a generation's first round costs beyond its priced steps because it reads the prompt:
    a forward over the prompt on each model (empty caches of the engine `compile` names, timed
    now) less the draft step and target-alone verification it stands in for. `draft=None`: the
    target alone."""
    if draft is None:
        return _prefill_ms(target, input_ids, compile) - times.target_alone_ms
    extra = _prefill_ms(target, input_ids, compile) - times.verify_ms[0]
    if times.draft_ms:
        extra += _prefill_ms(draft, input_ids, compile) - times.draft_ms[0]
    return extra


def _prefill_ms(model: PreTrainedModel, input_ids: torch.LongTensor, compile: bool) -> float:
    seq = input_ids[0].tolist()
    cached, _, _ = step_models(model, None, DecodingSettings(compile=compile), sampling_only(False), False, len(seq))
    with torch.inference_mode():
        start = time.perf_counter()
        cached.forward(seq, num_logits=1)
        return 1000 * (time.perf_counter() - start)


def measure_round_overhead(target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor,
                           tokens: int = 32, runs: int = 3, compile: bool = False) -> float:
    """The loop's own time per round (ms, `loop_overhead_ms`) in a `constant` K=3 decode of
    `tokens` tokens after `input_ids` (on the compiled engine when `compile`); the median of `runs`."""
    settings = DecodingSettings(schedule="constant", num_assistant_tokens=3, max_new_tokens=tokens, eos_token_id=[],
                                compile=compile)
    return statistics.median(loop_overhead_ms(decode(target, draft, input_ids, settings).stats) for _ in range(runs))


class CostProbe:
    """Times draft steps and target verifications on demand, so that an evaluation can sample the
    cost ratio between prompts all through a run (machine load then hits it as it hits the
    methods) instead of once at the start. The steps are the engine's (`EngineSteps`,
    eager, or compiled with `compile`, as the methods then run them): a draft step feeds one
    token, a target verification the last verified token plus `k` drafted ones, both after the
    prompt `input_ids` `[1, length]` is in the KV cache (as mid-generation); `warmup_steps` of
    each run untimed."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor,
                 k: int = 4, warmup_steps: int = 10, compile: bool = False) -> None:
        self.k = k
        self.steps = EngineSteps(target, draft, input_ids, k, compile)
        self.sample(warmup_steps)

    def sample(self, steps: int) -> tuple[list[float], list[float]]:
        """`steps` timings (ms) of each kind of step, alternating so that load on the machine
        hits both alike. Returns the draft step times and the target verification times."""
        self.steps.load()
        draft_ms, (target_ms,) = time_alternately(self.steps.draft_step, [self.steps.verify], steps)
        return draft_ms, target_ms


def measure_cost_ratio(target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor,
                       k: int = 4, steps: int = 50, warmup_steps: int = 10) -> dict:
    """Measure `c` on this machine now: `steps` alternating timings of a `CostProbe`, reduced by
    `costs.cost_ratio`. Returns its figures plus `"steps"`."""
    draft_ms, target_ms = CostProbe(target, draft, input_ids, k, warmup_steps).sample(steps)
    return {**cost_ratio(draft_ms, target_ms, k), "steps": steps}


def time_alternately(draft_step: Callable[[], None], verifies: list[Callable[[], None]],
                     steps: int) -> tuple[list[float], list[list[float]]]:
    """`steps` rounds of timing, for each of `verifies` in turn, one draft step and then that
    verification (ms), so that load on the machine hits them all alike. Returns the draft step
    times and each verification's times."""
    draft_ms, verify_ms = [], [[] for _ in verifies]
    for _ in range(steps):
        for times, verification in zip(verify_ms, verifies):
            draft_ms.append(1000 * timed(draft_step))
            times.append(1000 * timed(verification))
    return draft_ms, verify_ms


def timed(step: Callable[[], None]) -> float:
    """Seconds one call of `step` takes."""
    start = time.perf_counter()
    step()
    return time.perf_counter() - start
