"""The cost model: what decoding costs per generated token, in two named views.

- **flat** (`FLAT_COST`, in target verifications): a generation costs `target calls + c x draft
  calls`, with `c` = one draft step / one target verification of `k = 4` drafted tokens, both
  measured on this machine (`cost_ratio`). Every verification costs the same, as on a GPU; the
  evaluation tables, the demo and `benchmarks/results_tables.py` count in this view.
- **measured** (`MEASURED_COST`, in target-alone steps): every part of every round priced with
  this device's measured step times (`StepTimes`, timed by `specdecpp.measuring.step_timing`), so that
  1 / cost is the speedup predicted on this device; the threshold replay (`specdecpp.calibration.threshold`)
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

Timed figures are noisy, and load on the machine can price one length at several times its
neighbours. So `verify(k)` is priced by a fit over lengths (`fit_verify_ms`: a robust,
non-decreasing line), and the spread between timing passes (`pass_spread`) says whether the
machine was too busy for the figures to be trusted (`BUSY_SPREAD`).
"""
from __future__ import annotations

import itertools
import statistics
import warnings
from dataclasses import dataclass, field

# The two views' names, with their units, as every table header shows them.
FLAT_COST = "flat cost/tok (target verifications)"
MEASURED_COST = "measured cost/tok (target-alone steps)"
FLAT_UNIT = "target verifications per token: (target calls + c x draft calls) / token, c = draft step / target " \
            "verification of 4 tokens (every verification priced alike, as on a GPU)"
MEASURED_UNIT = "target-alone steps per token: every draft step, judgement, verification (by its length) and " \
                "the loop's overhead priced with this device's measured times (1 / cost = predicted speedup)"
# The spread between timing passes (`pass_spread`) above which the machine was too busy for the
# step times to be trusted: passes on a steady machine stay well under it (a few percent), while a
# process competing for the cores spreads them by tens of percent.
BUSY_SPREAD = 0.25


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
    """The flat view of replayed methods (`specdecpp.calibration.threshold`'s `calls_per_token`: method ->
    [target calls, draft calls] per token), `c` taken from the measured `times` (`StepTimes.cost_ratio`)."""
    c = times.cost_ratio()
    return {method: cost_per_token(flat_spent(target, draft, c), 1.0)
            for method, (target, draft) in calls_per_token.items()}


def cost_ratio(draft_ms: list[float], target_ms: list[float], k: int = 4) -> dict:
    """The flat view's `c` = median draft step time / median target verification time, from
    timings in milliseconds. Returns `{"cost_ratio", "draft_step_ms", "target_verify_ms", "k"}`."""
    draft, target = statistics.median(draft_ms), statistics.median(target_ms)
    return {"cost_ratio": draft / target, "draft_step_ms": draft, "target_verify_ms": target, "k": k}


def verify_slope(verify_ms: list[float]) -> float:
    """How much a verification grows per drafted token: the Theil-Sen slope (the median of the
    slopes between every two lengths) of `verify_ms[k]` over `k >= 1`, at least 0. A median, so
    that one length timed while the machine was busy moves it no more than any other length does;
    `k = 0` is left out, being a different step (one token: the compiled engine's own graph)."""
    points = list(enumerate(verify_ms))[1:]
    slopes = [(b - a) / (j - i) for (i, a), (j, b) in itertools.combinations(points, 2)]
    return max(statistics.median(slopes), 0.0) if slopes else 0.0


def fit_verify_ms(verify_ms: list[float]) -> list[float]:
    """The verification times to price rounds with, from measured medians `verify_ms[k]`: for
    `k >= 1` the line of slope `verify_slope` through the median of what is left of each length
    (so one slow length is ignored, and a longer verification never costs less than a shorter
    one), and for `k = 0` its own measurement, at most the fitted `k = 1`."""
    if len(verify_ms) < 2:
        return list(verify_ms)
    slope = verify_slope(verify_ms)
    intercept = statistics.median(v - slope * k for k, v in enumerate(verify_ms) if k >= 1)
    fitted = [intercept + slope * k for k in range(1, len(verify_ms))]
    return [min(verify_ms[0], fitted[0])] + fitted


def pass_spread(per_pass_ms: list[list[float]]) -> float:
    """How far timing passes disagree: for each step (a list of its times, one per pass) the
    interquartile range over the median, and the median of that over steps. 0 with fewer than two
    passes."""
    spreads = []
    for times in per_pass_ms:
        if len(times) > 1:
            first, median, third = statistics.quantiles(times, n=4, method="inclusive")
            spreads.append((third - first) / median if median > 0 else 0.0)
    return statistics.median(spreads) if spreads else 0.0


def busy_machine(spread: float, what: str = "the step times") -> bool:
    """Whether the passes' `spread` (`pass_spread`) says the machine was busy while `what` was
    timed (above `BUSY_SPREAD`); warns when it does."""
    if spread <= BUSY_SPREAD:
        return False
    warnings.warn(f"the machine was busy while {what} were timed: the timing passes spread by {spread:.0%} "
                  f"(interquartile range over median), above the {BUSY_SPREAD:.0%} steady timing stays under, so "
                  "costs priced with them are doubtful; time again on a quieter machine, or pass --step_times_from "
                  "a head folder whose step times were measured on one", stacklevel=2)
    return True


@dataclass
class StepTimes:
    """Median times (ms) of each kind of step the loop takes (see the module docstring), and where
    they were measured. `verify_ms[k]` is a verification of `k` drafted tokens (`k = 0`: a
    target-alone step) as rounds are priced: fitted over lengths (`fit_verify_ms`) from the
    medians in `verify_ms_measured` (empty in times stored before the fit). `spread` is the
    timing passes' `pass_spread`, `busy` whether it was above `BUSY_SPREAD`; `judge_ms` is 0 for
    decoding without a head."""

    draft_ms: list[float]
    verify_ms: list[float]
    target_alone_ms: float
    judge_ms: float = 0.0
    round_overhead_ms: float = 0.0
    device: str = "cpu"
    threads: int = 1
    repeats: int = 0
    engine: str = "eager"  # the engine whose steps were timed: "eager" or "compiled"
    verify_ms_measured: list[float] = field(default_factory=list)
    spread: float = 0.0
    busy: bool = False

    def __post_init__(self):
        self._drafting_ms = [0.0] + list(itertools.accumulate(self.draft_ms))

    def round_ms(self, drafted: int, judged: int = 0, verified: int | None = None) -> float:
        """The time of one round that drafts `drafted` tokens of which the head judges `judged`
        and the target verifies the first `verified` (default: all drafted; fewer under adaptive
        verification, `verify-budget`); steps past the longest measured round cost as much as its last."""
        longest = len(self.draft_ms)
        drafting = self._drafting_ms[min(drafted, longest)] + max(drafted - longest, 0) * (self.draft_ms or [0.0])[-1]
        verified = drafted if verified is None else verified
        return self.verify_ms[min(verified, len(self.verify_ms) - 1)] + drafting + judged * self.judge_ms \
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

