"""The cost model: what decoding costs per generated token, in two named views.

- **flat** (`FLAT_COST`, in target verifications): a generation costs `target calls + c x draft
  calls`, with `c` = one draft step / one target verification of `k = 4` drafted tokens, both
  measured on this machine (`cost_ratio`). Every verification costs the same, as on a GPU; the
  evaluation tables, the demo and `benchmarks/results_tables.py` count in this view.
- **measured** (`MEASURED_COST`, in target-alone steps): every part of every round priced with
  this device's measured step times (`StepTimes`, timed by `specdecpp.step_timing`), so that
  1 / cost is the speedup predicted on this device; the threshold replay (`specdecpp.threshold`)
  and the head's card count in this view.

`cost_per_token` computes both: the time spent over the tokens generated, in the view's unit
(`flat_spent` prices a generation's calls in the flat view). Under flat step times (every
verification and target-alone step `V`, every draft step `D`, no judgement or loop overhead)
the two views agree, with `c = D / V`.

A speculative round that drafts `k` tokens costs, in the measured view,

    verify(k) + draft(1) + ... + draft(k) + judged * judge + round_overhead

- `verify(k)`: the target's forward over `[last verified token, y_1..y_k]` and the acceptance test;
  on a GPU nearly flat in `k`, on a CPU it grows with the tokens checked;
- `draft(j)`: the round's `j`-th draft step (forward, softmax, the token's choice). A verification
  pushes the draft's weights out of the CPU's caches, so a round's first draft steps cost more
  than its later ones;
- `judge`: the acceptance head's judgement of one drafted token (`ada` only);
- `round_overhead`: the loop's own work per round beyond those steps (cache crops, bookkeeping).

A generation without a draft costs `target_alone` per token: back-to-back target steps, whose
weights stay in the caches. This module is arithmetic only (no models, no engine), so the card
and the tables use it without importing the decoder.
"""
from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass

# The two views' names, with their units, as every table header shows them.
FLAT_COST = "flat cost/tok (target verifications)"
MEASURED_COST = "measured cost/tok (target-alone steps)"
FLAT_UNIT = "target verifications per token: (target calls + c x draft calls) / token, c = draft step / target " \
            "verification of 4 tokens (every verification priced alike, as on a GPU)"
MEASURED_UNIT = "target-alone steps per token: every draft step, judgement, verification (by its length) and " \
                "the loop's overhead priced with this device's measured times (1 / cost = predicted speedup)"


def cost_per_token(spent: float, tokens: float, unit: float = 1.0) -> float:
    """Cost per generated token: `spent` (ms, or already in the view's unit) over `unit` (what
    one unit costs in the same measure: a target-alone step's ms for the measured view, 1 for
    `flat_spent`'s verifications) per token; NaN when nothing was generated."""
    if tokens <= 0:
        return float("nan")
    return spent / unit / tokens


def flat_spent(target_calls: float, draft_calls: float, cost_ratio: float) -> float:
    """What a generation's calls cost in the flat view, in target verifications: each target call
    one, each draft step `cost_ratio` (c)."""
    return target_calls + cost_ratio * draft_calls


def flat_costs(calls_per_token: dict[str, list[float]], times: StepTimes) -> dict[str, float]:
    """The flat view of replayed methods (`specdecpp.threshold`'s `calls_per_token`: method ->
    [target calls, draft calls] per token), `c` taken from the measured `times` (`StepTimes.cost_ratio`)."""
    c = times.cost_ratio()
    return {method: cost_per_token(flat_spent(target, draft, c), 1.0)
            for method, (target, draft) in calls_per_token.items()}


def cost_ratio(draft_ms: list[float], target_ms: list[float], k: int = 4) -> dict:
    """The flat view's `c` = median draft step time / median target verification time, from
    timings in milliseconds. Returns `{"cost_ratio", "draft_step_ms", "target_verify_ms", "k"}`."""
    draft, target = statistics.median(draft_ms), statistics.median(target_ms)
    return {"cost_ratio": draft / target, "draft_step_ms": draft, "target_verify_ms": target, "k": k}


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
    engine: str = "eager"  # the engine whose steps were timed: "eager" or "compiled"

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

    def cost_ratio(self, k: int = 4) -> float:
        """The flat view's `c` from these times: the median draft step of a `k`-token round over
        the verification of its `k` tokens (`cost_ratio`)."""
        verify_ms = self.verify_ms[min(k, len(self.verify_ms) - 1)]
        return cost_ratio(self.draft_ms[:k] or [0.0], [verify_ms], k)["cost_ratio"]

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


def loop_overhead_ms(stats) -> float:
    """The loop's own time per round (ms) in one generation's `GenerationStats`: its wall time
    less the time inside draft steps, verifications and stop decisions, over its rounds."""
    own = stats.wall_time - stats.draft_time - stats.verify_time - stats.schedule_time
    return 1000 * own / max(stats.target_calls, 1)

