"""vLLM 0.32.0's online acceptance estimator for one sequence and its adaptive verification (docs/design.md)."""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

MAX_LOG_ODDS = 40.0  # vLLM's _MAX_LOG_ODDS: the clamp on the feature
INIT_SLOPE, INIT_BIAS = 0.5, -0.2  # vLLM's cold start (_INIT_SLOPE, _INIT_BIAS)
REFIT_INTERVAL = 100  # steps (verifications) between refits
DAMPING_OBSERVATIONS = 50.0
L2 = 1e-3  # the ridge on the Newton solve
RECALIBRATION_FILE = "online_recalibration.json"  # where a head folder keeps its recalibration state


def clamp_log_odds(value: float) -> float:
    """`value` clamped to +-`MAX_LOG_ODDS`."""
    return min(max(value, -MAX_LOG_ODDS), MAX_LOG_ODDS)


def log_odds(p: float) -> float:
    """`log(p / (1 - p))`, clamped to +-`MAX_LOG_ODDS`."""
    if p <= 0.0:
        return -MAX_LOG_ODDS
    if p >= 1.0:
        return MAX_LOG_ODDS
    return clamp_log_odds(math.log(p) - math.log1p(-p))


def log_odds_from_log(log_p: float) -> float:
    """`log_odds(exp(log_p))`, exact for p near 1."""
    return MAX_LOG_ODDS if log_p >= 0.0 else clamp_log_odds(log_p - math.log(-math.expm1(log_p)))


def sigmoid(x: float) -> float:
    """The logistic function, without overflow."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@dataclass
class OnlineAcceptanceEstimator:
    """P(accept at draft position k) = `sigmoid(slope * f + intercepts[k])`, learned from verification
    outcomes by vLLM's damped IRLS refits; vLLM's cold start by default, `learn=False` frozen."""

    num_positions: int = 20
    slope: float = INIT_SLOPE
    intercepts: list[float] = field(default_factory=list)
    refit_interval: int = REFIT_INTERVAL
    damping: float = DAMPING_OBSERVATIONS
    ridge: float = L2
    learn: bool = True
    steps: int = 0  # verifications observed
    refits: int = 0
    # Per position, sums of w f^2, w f, w, (y - p) f, (y - p) and the count of labelled tokens.
    window: list[list[float]] = field(default_factory=list)
    # When a list, every labelled (position, feature, label), for an offline fit.
    history: list[tuple[int, float, float]] | None = None

    def __post_init__(self):
        if self.num_positions < 1 or self.refit_interval < 1:
            raise ValueError(f"num_positions and refit_interval must be >= 1, got {self.num_positions}, "
                             f"{self.refit_interval}")
        if not self.intercepts:
            self.intercepts = [INIT_BIAS] * self.num_positions
        if len(self.intercepts) != self.num_positions:
            raise ValueError(f"{len(self.intercepts)} intercepts for {self.num_positions} positions")
        if not self.window:
            self.window = [[0.0] * 6 for _ in range(self.num_positions)]

    @classmethod
    def recalibration(cls, num_positions: int = 20, **options) -> OnlineAcceptanceEstimator:
        """An estimator correcting a head's logit `z`: `sigmoid(s * z + b_k)`, from no correction (s=1, b_k=0)."""
        return cls(num_positions, slope=1.0, intercepts=[0.0] * num_positions, **options)

    def predict(self, position: int, feature: float) -> float:
        """P(accept) of the token drafted at 0-based `position` whose feature is `feature`."""
        return sigmoid(self.slope * feature + self.intercepts[position])

    def observe(self, features: list[float], predictions: list[float], num_verified: int, num_accepted: int) -> None:
        """Fold one verification in: the judged tokens' `features` and `predictions`, labelled accepted below
        `num_accepted` and rejected at it (verified positions only); refit when the window is full."""
        if not self.learn:
            return
        for i, (f, p) in enumerate(zip(features, predictions)):
            if i > num_accepted or i >= num_verified:
                break
            self._add(i, f, p, 1.0 if i < num_accepted else 0.0)
        self.steps += 1
        if self.steps % self.refit_interval == 0:
            self.refit()

    def _add(self, position: int, feature: float, prediction: float, label: float) -> None:
        if self.history is not None:
            self.history.append((position, feature, label))
        w, r = prediction * (1.0 - prediction), label - prediction
        for i, value in enumerate((w * feature * feature, w * feature, w, r * feature, r, 1.0)):
            self.window[position][i] += value

    def refit(self) -> None:
        """One damped Newton step on the window (vLLM's `_refit_kernel`), then a clear window."""
        a = sum(s[0] for s in self.window) + self.ridge
        g0 = sum(s[3] for s in self.window)
        shrink = sum(s[1] * s[1] / (s[2] + self.ridge) for s in self.window)
        coupling = sum(s[1] * s[4] / (s[2] + self.ridge) for s in self.window)
        step_w = (g0 - coupling) / (a - shrink)
        total_n = sum(s[5] for s in self.window)
        step_w *= total_n / (total_n + self.damping) if total_n + self.damping > 0 else 0.0
        if not math.isfinite(step_w) or self.slope + step_w < 0.0:
            step_w = 0.0
        self.slope += step_w
        for k, (_, b, c, _, g1, n) in enumerate(self.window):
            step_b = (g1 - b * step_w) / (c + self.ridge) * (n / (n + self.damping) if n + self.damping > 0 else 0.0)
            if math.isfinite(step_b):
                self.intercepts[k] += step_b
        self.window = [[0.0] * 6 for _ in range(self.num_positions)]
        self.refits += 1

    def frozen(self) -> OnlineAcceptanceEstimator:
        """A copy with these coefficients that no longer learns."""
        return OnlineAcceptanceEstimator(self.num_positions, self.slope, list(self.intercepts), self.refit_interval,
                                         self.damping, self.ridge, learn=False)

    def save(self, path: str | os.PathLike) -> None:
        """Write the state (not the `history`) as JSON to a file or a head folder (`RECALIBRATION_FILE`)."""
        with open(_state_file(path), "w", encoding="utf-8") as f:
            json.dump(asdict(self) | {"history": None}, f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> OnlineAcceptanceEstimator:
        """The state `save` wrote to `path` (a file, or a folder holding `RECALIBRATION_FILE`)."""
        with open(_state_file(path), encoding="utf-8") as f:
            return cls(**json.load(f))


def _state_file(path: str | os.PathLike) -> str:
    return os.path.join(path, RECALIBRATION_FILE) if os.path.isdir(path) else str(path)


def best_verify_length(survival: list[float], round_costs: list[float]) -> int:
    """vLLM's adaptive verification: the `n` maximising `(1 + sum(survival[:n])) / round_costs[n]` (the shortest)."""
    best, best_rate, expected = 0, -1.0, 1.0
    for n, cost in enumerate(round_costs[:len(survival) + 1]):
        if n:
            expected += survival[n - 1]
        if expected / cost > best_rate:
            best, best_rate = n, expected / cost
    return best
