"""Timing the loop's steps through the engine's own step functions: `StepTimes` and the cost ratio `c`."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specdecpp import __version__
from specdecpp.costs import StepTimes, busy_machine, cost_ratio, fit_verify_ms, loop_overhead_ms, pass_spread
from specdecpp.engine.decoding import GenerationStats, decode, draft_round, step_models, verify
from specdecpp.engine.draft_step import DraftStep
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.schedules import MAX_TREE_NODES, HeadJudge, Schedule, make_schedule
from specdecpp.engine.settings import DecodingSettings, default
from specdecpp.engine.tree import grow_tree
from specdecpp.head.model import AcceptancePredictionHead


def measure_costs(target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor, max_draft: int,
                  head: AcceptancePredictionHead | None = None, do_sample: bool = False,
                  repeats: int = 8, compile: bool = False) -> tuple[StepTimes, StepTimes | None]:
    """`(plain, judged)` `StepTimes` on the context `input_ids`, round overhead included (`judged`: with `head`)."""
    probes = [StepProbe(target, draft, input_ids, max_draft, head=judge, do_sample=do_sample, compile=compile)
              for judge in ([None] if head is None else [None, head])]
    for _ in range(repeats):
        for probe in probes:
            probe.sample()
    plain = probes[0].times()
    plain.round_overhead_ms = measure_round_overhead(target, draft, input_ids, compile=compile)
    return plain, replace(probes[1].times(), round_overhead_ms=plain.round_overhead_ms) if head is not None else None


class StepProbe:
    """Times target-alone steps and rounds of `0..max_draft` tokens on a fixed context, a pass per `sample`."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor, max_draft: int,
                 head: AcceptancePredictionHead | None = None, do_sample: bool = False, warmup: int = 2,
                 compile: bool = False, max_length: int | None = None):
        self.seq, self.max_draft, self.has_head = input_ids[0].tolist(), max_draft, head is not None
        self.device, self.engine = str(target.device), "compiled" if compile else "eager"
        self.processor, self.processing = processor_name(target.device), sampling_only(do_sample)
        self.generator = torch.Generator(target.device).manual_seed(0) if do_sample else None
        self.judge = HeadJudge(head) if head is not None else None
        self.models = lambda: step_models(target, draft, DecodingSettings(
            schedule="ada" if head is not None else "constant", head=head, do_sample=do_sample, compile=compile,
            bound=default("bound")),
            self.processing, max(max_length or 0, len(self.seq) + max_draft + 1))[:2]
        self.drafts, self.verified = [[] for _ in range(max_draft)], [[] for _ in range(max_draft + 1)]
        self.alone, self.judged, self.passes = [], [], 0
        self._load()
        with torch.inference_mode():
            for _ in range(warmup):
                self._pass()

    def _load(self) -> None:
        self.target_model, self.draft_model = loaded_models(self.models, self.seq, self.generator)

    def sample(self, passes: int = 1) -> None:
        if self.engine == "compiled":
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
        """The passes' medians (no round overhead); warns and sets `busy` when the machine was busy."""
        median = statistics.median
        verify_ms, spread = [median(v) for v in self.verified], pass_spread(self.verified)
        return StepTimes(draft_ms=[median(t) for t in self.drafts], verify_ms=fit_verify_ms(verify_ms),
                         target_alone_ms=median(self.alone), judge_ms=median(self.judged) if self.has_head else 0.0,
                         device=self.device, processor=self.processor, threads=torch.get_num_threads(),
                         repeats=self.passes, engine=self.engine, verify_ms_measured=verify_ms, spread=spread,
                         busy=busy_machine(spread, f"the {self.engine} engine's steps"))

    def _pass(self) -> tuple[list[float], list[list[float]], list[list[float]], list[float]]:
        seq, processing, generator = self.seq, self.processing, self.generator
        alone, drafts, verified, judged = [], [[] for _ in range(self.max_draft)], [], []
        for _ in range(self.max_draft + 1):  # target-alone steps back to back; each rollback untimed, as in the loop
            start = time.perf_counter()
            verify(self.target_model, seq, [], [], processing, generator)
            alone.append(1000 * (time.perf_counter() - start))
            self.target_model.crop(len(seq) - 1)
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
            verified.append([1000 * (time.perf_counter() - start)])
            self.target_model.crop(len(seq) - 1)
            self.draft_model.crop(len(seq) - 1)
        return alone, drafts, verified, judged


class TimedRound(Schedule):
    """A round of exactly `k` tokens, each judged by `judge` when given, timed from the loop's own totals."""

    def __init__(self, k: int, judge: HeadJudge | None, stats: GenerationStats):
        self.k, self.judge, self.stats, self.totals = k, judge, stats, []

    def start_round(self) -> None:
        self.totals = []
        if self.judge is not None:
            self.judge.start_round()

    def max_draft(self) -> int:
        return self.k

    def stop_after(self, step: DraftStep) -> bool:
        self.totals.append((self.stats.draft_time, self.stats.schedule_time))
        if self.judge is not None:
            self.judge(step)
        return False

    def step_ms(self) -> list[tuple[float, float]]:
        """`(draft step, judgement)` in ms for each drafted token."""
        totals = self.totals + [(self.stats.draft_time, self.stats.schedule_time)]
        return [(1000 * (after[0] - before[0]), 1000 * (after[1] - before[1]))
                for before, after in zip(totals, totals[1:])]


class LevelsOfWidth:
    """Timing tree policy: `policy`'s scores, each level past the root's expanding its first `nodes`, none verified."""

    def __init__(self, policy, nodes: int):
        self.width, self.nodes = policy.width, nodes
        self.score_children, self.valued, self.weigh = policy.score_children, policy.valued, policy.weigh

    def observe_levels(self, widths: list[int], seconds: float) -> None:
        """Timing takes its own measurements: none."""

    def expand(self, newest: list, drafted: list, widths: list[int]) -> list[int]:
        return list(range(min(self.nodes, len(newest))))

    def select(self, drafted: list, widths: list[int]) -> list[int]:
        return []


def measure_level_ms(target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor,
                     head: AcceptancePredictionHead, tree_width: int, compile: bool = False, depth: int = 5,
                     repeats: int = 4) -> list[float]:
    """`ada-tree`'s draft level by the nodes it expands, `[w - 1]` for `w` in `1..tree_width` (ms, medians over
    `repeats`): a tree of `depth` levels, less its root level alone, over the levels after the root, each level
    one draft forward over `w` nodes and the head's judgement of their children, on the context `input_ids`."""
    settings = DecodingSettings(schedule="ada-tree", head=head, stop_threshold=1.0, tree_nodes=MAX_TREE_NODES,
                                tree_width=tree_width, compile=compile, bound=(1, depth)).with_head_defaults()
    seq, processing = input_ids[0].tolist(), sampling_only(False)
    _, draft_model, _ = step_models(target, draft, settings, processing, len(seq) + depth * tree_width + 1)
    policy = make_schedule(settings)

    def grown_ms(nodes: int, levels: int) -> float:
        stats = GenerationStats()
        grow_tree(draft_model, seq, LevelsOfWidth(policy, nodes), levels, processing, None, stats)
        draft_model.crop(len(seq) - 1)
        return 1000 * (stats.draft_time + stats.schedule_time)

    with torch.inference_mode():
        draft_model.forward(seq, num_logits=1)
        draft_model.crop(len(seq) - 1)
        for nodes in range(1, tree_width + 1):  # warm-up, every width
            grown_ms(nodes, depth)
        return [statistics.median((grown_ms(nodes, depth) - grown_ms(nodes, 1)) / (depth - 1) for _ in range(repeats))
                for nodes in range(1, tree_width + 1)]


def loaded_models(models, seq: list[int], generator: torch.Generator | None = None) -> tuple:
    """The engine's target and draft (`decoding.step_models`) with the context `seq` in their caches."""
    target_model, draft_model = models()
    with torch.inference_mode():
        target_model.logits(seq, num_logits=1)
        draft_model.draft_step(seq, 1, generator)
    target_model.crop(len(seq) - 1)
    draft_model.crop(len(seq) - 1)
    return target_model, draft_model


class EngineSteps:
    """One draft step and one verification of `k` drafted tokens, each leaving the caches as it found them."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor, k: int,
                 compile: bool = False):
        self.seq, self.k, self.compiled = input_ids[0].tolist(), k, compile
        self.processing = sampling_only(False)
        self.models = lambda: step_models(target, draft, DecodingSettings(compile=compile, bound=default("bound")),
                                          self.processing, len(self.seq) + k + 1)[:2]
        self.target_model, self.draft_model = loaded_models(self.models, self.seq)

    def load(self) -> None:
        if self.compiled:
            self.target_model, self.draft_model = loaded_models(self.models, self.seq)

    def draft_step(self) -> None:
        with torch.inference_mode():
            self.draft_model.draft_step(self.seq, 1, None)
        self.draft_model.crop(len(self.seq) - 1)

    def verify(self) -> None:
        with torch.inference_mode():
            verify(self.target_model, self.seq, self.seq[-1:] * self.k, [], self.processing, None)
        self.target_model.crop(len(self.seq) - 1)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with `threads` torch CPU threads (0: as they are), then set them back."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure_round_overhead(target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor,
                           tokens: int = 32, runs: int = 3, compile: bool = False) -> float:
    """The loop's own time per round (ms), the median of `runs` `constant` K=3 decodes of `tokens` tokens."""
    settings = DecodingSettings(schedule="constant", num_assistant_tokens=3, max_new_tokens=tokens, eos_token_id=[],
                                compile=compile)
    return statistics.median(loop_overhead_ms(decode(target, draft, input_ids, settings).stats) for _ in range(runs))


class CostProbe:
    """Times draft steps and verifications after the prompt `input_ids` on demand, so `c` is sampled all run."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor,
                 k: int = 4, warmup_steps: int = 10, compile: bool = False) -> None:
        self.k = k
        self.steps = EngineSteps(target, draft, input_ids, k, compile)
        self.sample(warmup_steps)

    def sample(self, steps: int) -> tuple[list[float], list[float]]:
        """`steps` alternating timings (ms), so that load hits both alike: `(draft step times, verification times)`."""
        self.steps.load()
        draft_ms, target_ms = [], []
        for _ in range(steps):
            draft_ms.append(1000 * timed(self.steps.draft_step))
            target_ms.append(1000 * timed(self.steps.verify))
        return draft_ms, target_ms


def measure_cost_ratio(target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor,
                       k: int = 4, steps: int = 50, warmup_steps: int = 10) -> dict:
    """`c` on this machine now, from `steps` alternating timings (`costs.cost_ratio`'s figures plus `steps`)."""
    draft_ms, target_ms = CostProbe(target, draft, input_ids, k, warmup_steps).sample(steps)
    return {**cost_ratio(draft_ms, target_ms, k), "steps": steps}


def timed(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


STEP_TIMES_CACHE = Path(os.environ.get("SPECDECPP_CACHE", Path.home() / ".cache" / "specdecpp")) / "step_times"


@functools.cache  # read once per device: auto asks before every generation
def processor_name(device: torch.device) -> str:
    """The processor running `device`'s work, keying step times: a GPU's name, or the CPU's and its ISA."""
    if device.type != "cpu":
        return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine())
    return f"{model} ({torch.backends.cpu.get_cpu_capability()})"


def auto_step_times(head: AcceptancePredictionHead, target: PreTrainedModel, draft: PreTrainedModel,
                    compile: bool = False) -> StepTimes | None:
    """The step times `stop_threshold="auto"` chooses with here: None where the stored threshold was priced here
    or set by hand (no times), or (warning) where the head stores no replayed rounds; else `device_step_times`."""
    selection = head.threshold_selection or {}
    stored = selection.get("judged_step_times") or {}
    here = {"device": str(target.device), "processor": processor_name(target.device),
            "engine": "compiled" if compile else "eager"}
    if target.device.type == "cpu":
        here["threads"] = torch.get_num_threads()
    if not stored or all(stored.get(key) == value for key, value in here.items()):
        return None
    if not selection.get("round_weights"):
        warnings.warn(f"stop_threshold='auto' uses the threshold priced with {stored.get('device')} "
                      f"({stored.get('engine', 'eager')}) step times, not this {here['device']} ({here['engine']}): "
                      "the head stores no replayed rounds to choose again from (calibrate it again to store them)",
                      stacklevel=2)
        return None
    return device_step_times(target, draft, head, compile)


def device_step_times(target: PreTrainedModel, draft: PreTrainedModel, head: AcceptancePredictionHead,
                      compile: bool = False, context: int = 128, repeats: int = 4,
                      cache_dir: Path | None = None, tree_width: int = 0) -> StepTimes:
    """`ada`'s step times with `head` for this pair where it runs, with `ada-tree`'s `level_ms` up to `tree_width` nodes
    (0: none): timed once on `context` random tokens, kept in `cache_dir` (default `STEP_TIMES_CACHE`)."""
    key = {"target": target.name_or_path, "draft": draft.name_or_path, "head": head.config,
           "device": processor_name(target.device), "dtype": str(target.dtype),
           "engine": "compiled" if compile else "eager", "threads": torch.get_num_threads(), "specdecpp": __version__}
    if tree_width:
        key["tree_width"] = tree_width
    path = Path(cache_dir or STEP_TIMES_CACHE) / (hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
                              + ".json")
    if path.exists():  # priced again from the kept medians, with today's fit
        times = StepTimes(**json.loads(path.read_text())["judged_step_times"])
        return replace(times, verify_ms=fit_verify_ms(times.verify_ms_measured)) if times.verify_ms_measured else times
    print(f"specdecpp: timing this pair's steps on {key['device']} ({key['dtype']}, {key['engine']}) for "
          f"stop_threshold='auto', once; kept in {path}", file=sys.stderr, flush=True)
    vocab = min(target.config.vocab_size, draft.config.vocab_size)
    input_ids = torch.randint(vocab, (1, context), generator=torch.Generator().manual_seed(0)).to(target.device)
    bound = (head.threshold_selection or {}).get("bound") or [1, 20]
    start = time.perf_counter()
    plain, judged = measure_costs(target, draft, input_ids, bound[1], head=head, repeats=repeats, compile=compile)
    judged = replace(judged, target_alone_ms=plain.target_alone_ms, level_ms=measure_level_ms(
        target, draft, input_ids, head, tree_width, compile) if tree_width else [])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "judged_step_times": judged.as_dict()}, indent=1, default=str) + "\n")
    print(f"specdecpp: timed in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return judged
