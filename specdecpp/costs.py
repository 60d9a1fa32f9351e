"""What decoding costs per token, flat and measured (docs/design.md, The cost model). Arithmetic only."""
from __future__ import annotations

import itertools
import statistics
import warnings
from dataclasses import dataclass, field

FLAT_COST = "flat cost/tok (target verifications)"
MEASURED_COST = "measured cost/tok (target-alone steps)"
FLAT_UNIT = "target verifications per token: (target calls + c x draft calls) / token, c = draft step / target " \
            "verification of 4 tokens (every verification priced alike, as on a GPU)"
BUSY_SPREAD = 0.25  # the `pass_spread` above which step times are not trusted
ONE_LENGTH_OUTLIER = 0.1  # how far one verification length's time departs from both nearest ones before it is ignored


def cost_per_token(spent: float, tokens: float, unit: float = 1.0) -> float:
    """`spent` over `unit` per token, in the view's unit; NaN when nothing was generated."""
    return spent / unit / tokens if tokens > 0 else float("nan")


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
    """The Theil-Sen slope of `verify_ms[k]` over `k >= 1`, at least 0."""
    slopes = [(b - a) / (j - i) for (i, a), (j, b) in itertools.combinations(list(enumerate(verify_ms))[1:], 2)]
    return max(statistics.median(slopes), 0.0) if slopes else 0.0


def fit_verify_ms(verify_ms: list[float]) -> list[float]:
    """Verification times for pricing: each length's median, except that a length `k >= 1` above (or below) both of
    its two nearest lengths by more than `ONE_LENGTH_OUTLIER` takes the value of their line there, so one slow length
    is ignored and a change of cost that lasts two lengths or more is kept; `k = 0` at most `k = 1`."""
    rest = fitted = list(verify_ms[1:])
    if len(rest) >= 3:
        fitted = []
        for k, ms in enumerate(rest):
            i, j = (k - 1, k + 1) if 0 < k < len(rest) - 1 else (1, 2) if k == 0 else (k - 1, k - 2)
            if all(ms > rest[n] * (1 + ONE_LENGTH_OUTLIER) for n in (i, j)) \
                    or all(ms < rest[n] * (1 - ONE_LENGTH_OUTLIER) for n in (i, j)):
                ms = min(max(rest[i] + (rest[j] - rest[i]) * (k - i) / (j - i), min(rest)), max(rest))
            fitted.append(ms)
    return [min(verify_ms[0], fitted[0])] + fitted if fitted else list(verify_ms)


def pass_spread(per_pass_ms: list[list[float]]) -> float:
    """The median over steps of each step's interquartile range over median; 0 with fewer than two passes."""
    spreads = []
    for times in per_pass_ms:
        if len(times) > 1:
            first, median, third = statistics.quantiles(times, n=4, method="inclusive")
            spreads.append((third - first) / median if median > 0 else 0.0)
    return statistics.median(spreads) if spreads else 0.0


def busy_machine(spread: float, what: str = "the step times") -> bool:
    """Whether `spread` is above `BUSY_SPREAD`; warns when it is."""
    if spread <= BUSY_SPREAD:
        return False
    warnings.warn(f"the machine was busy while {what} were timed: the timing passes spread by {spread:.0%} "
                  f"(interquartile range over median), above the {BUSY_SPREAD:.0%} steady timing stays under, so "
                  "costs priced with them are doubtful; time again on a quieter machine, or pass --step_times_from "
                  "a head folder whose step times were measured on one", stacklevel=2)
    return True


@dataclass
class StepTimes:
    """Median step times (ms) and where they were measured; `verify_ms[k]` prices verifying `k` drafted tokens."""

    draft_ms: list[float]
    verify_ms: list[float]
    target_alone_ms: float
    judge_ms: float = 0.0
    round_overhead_ms: float = 0.0
    device: str = "cpu"
    processor: str = ""  # the CPU's model and instruction set, or the GPU's name ("": not recorded)
    threads: int = 1
    repeats: int = 0
    engine: str = "eager"  # or "compiled"
    verify_ms_measured: list[float] = field(default_factory=list)
    spread: float = 0.0
    busy: bool = False
    level_ms: list[float] = field(default_factory=list)  # a token tree's level by the nodes it expands: [width - 1]

    def __post_init__(self):
        self._drafting_ms = [0.0] + list(itertools.accumulate(self.draft_ms))
        self._verify_slope = verify_slope(self.verify_ms)

    def round_ms(self, drafted: int, judged: int = 0, verified: int | None = None) -> float:
        """A round drafting `drafted` tokens, judging `judged`, verifying `verified` (default: all)."""
        verified = drafted if verified is None else verified
        return self.verify_ms[min(verified, len(self.verify_ms) - 1)] + self.drafting_ms(drafted) \
            + judged * self.judge_ms + self.round_overhead_ms

    def drafting_ms(self, steps: int) -> float:
        """A round's first `steps` draft steps, each priced at its place (past the timed ones, as the last)."""
        longest = len(self.draft_ms)
        return self._drafting_ms[min(steps, longest)] + max(steps - longest, 0) * (self.draft_ms or [0.0])[-1]

    def verify_at(self, num_drafted: int) -> float:
        """The verification of `num_drafted` tokens (chain or tree), past the timed lengths along `verify_slope`."""
        last = len(self.verify_ms) - 1
        return self.verify_ms[min(num_drafted, last)] + max(num_drafted - last, 0) * self._verify_slope

    def level_price(self, place: int, width: int) -> float:
        """A token tree's draft level at `place` (0: the root's) that expands `width` nodes: its timed price by
        width (past the widest timed, the widest's; timed after a root), the root's dearer by what the chain's first
        step costs over its cheapest (both feed a round's verified tokens on cooled caches); else, without
        `level_ms`, the chain's draft step at `place`."""
        step = self.drafting_ms(place + 1) - self.drafting_ms(place)
        if self.level_ms:
            return self.level_ms[min(width, len(self.level_ms)) - 1] + (step - min(self.draft_ms) if place == 0 else 0)
        return step

    def tree_levels_ms(self, widths: list[int]) -> float:
        """A token tree's draft levels, expanding `widths[i]` nodes at each place `i`."""
        return sum(self.level_price(place, width) for place, width in enumerate(widths))

    def tree_round_ms(self, widths: list[int], num_nodes: int) -> float:
        """A token tree's round: its draft levels (`tree_levels_ms`) and the verification of `num_nodes` nodes."""
        return self.round_after_levels_ms(self.tree_levels_ms(widths), num_nodes)

    def round_after_levels_ms(self, levels_ms: float, num_nodes: int) -> float:
        """A token tree's round whose draft levels cost `levels_ms`, verifying `num_nodes` nodes."""
        return self.verify_at(num_nodes) + levels_ms + self.round_overhead_ms

    def rounds_ms(self, round_weights: list[float], judged: bool = False) -> float:
        """The time of `round_weights[k]` rounds of `k` tokens each, every token judged when `judged`."""
        return sum(weight * self.round_ms(k, k if judged else 0) for k, weight in enumerate(round_weights) if weight)

    def cost_ratio(self, k: int = 4) -> float:
        """The flat view's `c` from these times, for rounds of `k` tokens."""
        verify_ms = self.verify_ms[min(k, len(self.verify_ms) - 1)]
        return cost_ratio(self.draft_ms[:k] or [0.0], [verify_ms], k)["cost_ratio"]

    def as_dict(self) -> dict:
        """The figures as a JSON-ready dict."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def loop_overhead_ms(stats) -> float:
    """The loop's own time per round (ms) in a `GenerationStats`."""
    own = stats.wall_time - stats.draft_time - stats.verify_time - stats.schedule_time
    return 1000 * own / max(stats.target_calls, 1)
