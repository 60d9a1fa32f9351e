"""The cost model (docs/design.md, The cost model): what decoding costs per generated token, in the flat view
(target verifications) and the measured view (this device's step times). Arithmetic only: no models, no engine."""
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
# The spread between timing passes (`pass_spread`) above which step times are not trusted.
BUSY_SPREAD = 0.25


def cost_per_token(spent: float, tokens: float, unit: float = 1.0) -> float:
    """`spent` over `unit` per token, in the view's unit; NaN when nothing was generated."""
    if tokens <= 0:
        return float("nan")
    return spent / unit / tokens


def flat_spent(target_calls: float, draft_calls: float, cost_ratio: float) -> float:
    """A generation's calls in the flat view: each target call 1, each draft step `cost_ratio`."""
    return target_calls + cost_ratio * draft_calls


def flat_costs(calls_per_token: dict[str, list[float]], times: StepTimes) -> dict[str, float]:
    """The flat view of replayed methods (method -> [target calls, draft calls] per token), `c` from `times`."""
    c = times.cost_ratio()
    return {method: cost_per_token(flat_spent(target, draft, c), 1.0)
            for method, (target, draft) in calls_per_token.items()}


def cost_ratio(draft_ms: list[float], target_ms: list[float], k: int = 4) -> dict:
    """The flat view's `c`: median draft step time over median target verification time (ms)."""
    draft, target = statistics.median(draft_ms), statistics.median(target_ms)
    return {"cost_ratio": draft / target, "draft_step_ms": draft, "target_verify_ms": target, "k": k}


def verify_slope(verify_ms: list[float]) -> float:
    """The Theil-Sen slope of `verify_ms[k]` over `k >= 1`, at least 0, so one busy length moves it no more than
    any other."""
    points = list(enumerate(verify_ms))[1:]
    slopes = [(b - a) / (j - i) for (i, a), (j, b) in itertools.combinations(points, 2)]
    return max(statistics.median(slopes), 0.0) if slopes else 0.0


def fit_verify_ms(verify_ms: list[float]) -> list[float]:
    """The verification times rounds are priced with: for `k >= 1` a non-decreasing robust line (`verify_slope`),
    for `k = 0` its own measurement, at most the fitted `k = 1`."""
    if len(verify_ms) < 2:
        return list(verify_ms)
    slope = verify_slope(verify_ms)
    intercept = statistics.median(v - slope * k for k, v in enumerate(verify_ms) if k >= 1)
    fitted = [intercept + slope * k for k in range(1, len(verify_ms))]
    return [min(verify_ms[0], fitted[0])] + fitted


def pass_spread(per_pass_ms: list[list[float]]) -> float:
    """The median over steps of the interquartile range over the median of each step's per-pass times; 0 with fewer
    than two passes."""
    spreads = []
    for times in per_pass_ms:
        if len(times) > 1:
            first, median, third = statistics.quantiles(times, n=4, method="inclusive")
            spreads.append((third - first) / median if median > 0 else 0.0)
    return statistics.median(spreads) if spreads else 0.0


def busy_machine(spread: float, what: str = "the step times") -> bool:
    """Whether `spread` is above `BUSY_SPREAD` (the machine was busy while `what` were timed); warns when it is."""
    if spread <= BUSY_SPREAD:
        return False
    warnings.warn(f"the machine was busy while {what} were timed: the timing passes spread by {spread:.0%} "
                  f"(interquartile range over median), above the {BUSY_SPREAD:.0%} steady timing stays under, so "
                  "costs priced with them are doubtful; time again on a quieter machine, or pass --step_times_from "
                  "a head folder whose step times were measured on one", stacklevel=2)
    return True


@dataclass
class StepTimes:
    """Median times (ms) of each kind of step the loop takes, and where they were measured. `verify_ms[k]` prices a
    verification of `k` drafted tokens (`k = 0`: a target-alone step), fitted from `verify_ms_measured`."""

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
        """One round that drafts `drafted` tokens, judges `judged` and verifies the first `verified` (default:
        all); steps past the longest measured round cost as its last."""
        longest = len(self.draft_ms)
        drafting = self._drafting_ms[min(drafted, longest)] + max(drafted - longest, 0) * (self.draft_ms or [0.0])[-1]
        verified = drafted if verified is None else verified
        return self.verify_ms[min(verified, len(self.verify_ms) - 1)] + drafting + judged * self.judge_ms \
            + self.round_overhead_ms

    def rounds_ms(self, round_weights: list[float], judged: bool = False) -> float:
        """The time of `round_weights[k]` rounds of `k` tokens each, every token judged when `judged`."""
        return sum(weight * self.round_ms(k, k if judged else 0) for k, weight in enumerate(round_weights) if weight)

    def predicted_ms(self, draft_lengths: list[int], judged: int = 0, with_draft: bool = True) -> float:
        """The time of rounds of `draft_lengths` and `judged` judgements, prefill left out; without a draft every
        round is a target-alone step."""
        if not with_draft:
            return len(draft_lengths) * self.target_alone_ms
        return sum(self.round_ms(k) for k in draft_lengths) + judged * self.judge_ms

    def cost_ratio(self, k: int = 4) -> float:
        """The flat view's `c` from these times, for rounds of `k` tokens."""
        verify_ms = self.verify_ms[min(k, len(self.verify_ms) - 1)]
        return cost_ratio(self.draft_ms[:k] or [0.0], [verify_ms], k)["cost_ratio"]

    def as_dict(self) -> dict:
        """The figures as a JSON-ready dict (what a head's threshold selection stores)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def judged_tokens(draft_lengths: list[int], alignment: str | None) -> int:
    """How many drafted tokens the head judges over rounds of `draft_lengths`: all for a proposer, all but each
    round's first for a reader, none without a head."""
    if alignment == "proposer":
        return sum(draft_lengths)
    if alignment == "reader":
        return sum(max(k - 1, 0) for k in draft_lengths)
    return 0


def loop_overhead_ms(stats) -> float:
    """The loop's own time per round (ms) in a `GenerationStats`: wall time less draft, verify and schedule
    time."""
    own = stats.wall_time - stats.draft_time - stats.verify_time - stats.schedule_time
    return 1000 * own / max(stats.target_calls, 1)

