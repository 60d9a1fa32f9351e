"""vLLM's online acceptance estimator, re-implemented for one sequence at a time.

vLLM 0.32.0 (`vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py`, `OnlineAcceptanceEstimator`)
predicts the probability that the target accepts the token drafted at position `k` (0-based) as
`sigmoid(w * f + b_k)`: one slope `w` shared by all positions, an intercept `b_k` per position,
and a feature `f` the caller supplies. vLLM's feature is the log-odds of the draft's top
probability, `logit(max q)`, clamped to +-40 (`draft_log_odds`); SpecDec++'s online recalibration
feeds the head's own logit instead (`OnlineAcceptanceEstimator.recalibration`).

It learns from verification outcomes: after each verification (one "step"), the accepted tokens
and the first rejected one are labelled (1, 0), each with the prediction made when it was drafted,
and folded into the IRLS statistics of the Bernoulli log-likelihood (design row `x = [f, e_k]`,
weight `p (1 - p)`, residual `y - p`). Every `REFIT_INTERVAL` steps one Newton step solves
`(X^T W X + ridge I) d = X^T (y - p)` over the steps since the last refit (an arrowhead system:
the slope's row is solved by eliminating the intercepts), then damps the slope's step by
`N / (N + DAMPING)` (`N`: the window's observations), drops it if it would make the slope
negative, and moves each intercept by its Newton step given the slope's, damped by its own
`n_k / (n_k + DAMPING)`. The window's statistics are then cleared. The state is a few floats,
saved and loaded as JSON (`save`, `load`), so a deployment keeps what it learned.

This module is arithmetic only (no models, no torch, nothing else of the toolkit), so the
schedules, the threshold replay and the evaluation share it.
"""
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
    """`value` clamped to +-`MAX_LOG_ODDS` (an infinite log-odds becomes the bound)."""
    return min(max(value, -MAX_LOG_ODDS), MAX_LOG_ODDS)


def log_odds(p: float) -> float:
    """`log(p / (1 - p))`, clamped to +-`MAX_LOG_ODDS` (p = 0 or 1 give the bounds)."""
    if p <= 0.0:
        return -MAX_LOG_ODDS
    if p >= 1.0:
        return MAX_LOG_ODDS
    return clamp_log_odds(math.log(p) - math.log1p(-p))


def log_odds_from_log(log_p: float) -> float:
    """`log_odds` of `exp(log_p)`, without losing the digits of `1 - p` when p is near 1."""
    if log_p >= 0.0:
        return MAX_LOG_ODDS
    return clamp_log_odds(log_p - math.log(-math.expm1(log_p)))


def sigmoid(x: float) -> float:
    """The logistic function, without overflow for large |x|."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@dataclass
class OnlineAcceptanceEstimator:
    """P(accept at draft position k) = `sigmoid(slope * f + intercepts[k])`, learned online from
    verification outcomes as vLLM 0.32.0 learns it (see the module docstring). The default is
    vLLM's cold start for `num_positions` positions (slope 0.5, intercepts -0.2);
    `recalibration` starts at no correction. `observe` folds one verification in and refits every
    `refit_interval` steps; `learn=False` freezes the coefficients (an estimator fitted offline).
    One object carries its learning across generations when it is passed to each."""

    num_positions: int = 20
    slope: float = INIT_SLOPE
    intercepts: list[float] = field(default_factory=list)
    refit_interval: int = REFIT_INTERVAL
    damping: float = DAMPING_OBSERVATIONS
    ridge: float = L2
    learn: bool = True
    steps: int = 0  # verifications observed
    refits: int = 0
    # The current window's IRLS statistics per position: [a_k, b_k, c_k, g0_k, g1_k, n_k] =
    # sums of w f^2, w f, w, (y - p) f, (y - p) and the count of labelled tokens.
    window: list[list[float]] = field(default_factory=list)
    # When a list, every labelled observation is kept in it as (position, feature, label): the data
    # an estimator saw, for `fit_offline`.
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
        """An estimator that corrects a head's logit `z` (its feature): `sigmoid(s * z + b_k)`,
        starting at no correction (s = 1, b_k = 0), fitted as vLLM fits its estimator."""
        return cls(num_positions, slope=1.0, intercepts=[0.0] * num_positions, **options)

    def predict(self, position: int, feature: float) -> float:
        """P(accept) of the token drafted at 0-based `position` whose feature is `feature`."""
        return sigmoid(self.slope * feature + self.intercepts[position])

    def observe(self, features: list[float], predictions: list[float], num_verified: int, num_accepted: int) -> None:
        """Fold one verification in: `features[i]` and `predictions[i]` are those of the token
        drafted at position `i` (as many as were judged), `num_verified` tokens went to the target
        and `num_accepted` were accepted. Positions `i <= num_accepted` with `i < num_verified`
        are labelled (1 below `num_accepted`, 0 at it); then a refit when the window is full."""
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
        """Fold one labelled token into the window (vLLM's `_accumulate_kernel`)."""
        if self.history is not None:
            self.history.append((position, feature, label))
        w, r = prediction * (1.0 - prediction), label - prediction
        for i, value in enumerate((w * feature * feature, w * feature, w, r * feature, r, 1.0)):
            self.window[position][i] += value

    def refit(self) -> None:
        """One damped Newton (IRLS) step on the window's statistics, then a clear window: vLLM's
        `_refit_kernel`. The slope's step solves the arrowhead system with the intercepts
        eliminated, damped by the window's observations and dropped if the slope would go
        negative; each intercept's step is its Newton step given the slope's, damped by its own."""
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
        """Write the state (coefficients, counters, the current window; not the `history`) as
        JSON to `path`, a file or a folder (a head folder: `RECALIBRATION_FILE` in it)."""
        with open(_state_file(path), "w", encoding="utf-8") as f:
            json.dump(asdict(self) | {"history": None}, f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> OnlineAcceptanceEstimator:
        """The state `save` wrote to `path` (a file, or a folder holding `RECALIBRATION_FILE`)."""
        with open(_state_file(path), encoding="utf-8") as f:
            return cls(**json.load(f))


def _state_file(path: str | os.PathLike) -> str:
    return os.path.join(path, RECALIBRATION_FILE) if os.path.isdir(path) else str(path)


def fit_offline(observations: list[tuple[int, float, float]], num_positions: int, iterations: int = 50,
                ridge: float = L2) -> OnlineAcceptanceEstimator:
    """The estimator's form fitted to convergence on all `observations` `(position, feature,
    label)` at once (full, undamped Newton steps from vLLM's cold start, the slope kept >= 0):
    the best that form reaches on that data, frozen (`learn=False`)."""
    estimator = OnlineAcceptanceEstimator(num_positions, refit_interval=1, damping=0.0, ridge=ridge)
    for _ in range(iterations):
        before = (estimator.slope, list(estimator.intercepts))
        for position, feature, label in observations:
            estimator._add(position, feature, estimator.predict(position, feature), label)
        estimator.refit()
        change = max(abs(estimator.slope - before[0]),
                     max(abs(x - y) for x, y in zip(estimator.intercepts, before[1])))
        if change < 1e-10:
            break
    return estimator.frozen()


def best_verify_length(survival: list[float], round_costs: list[float]) -> int:
    """vLLM's adaptive verification at batch 1 (`adaptive_verification.py`,
    `AdaptiveVerificationManager.get_num_tokens`): of a drafted block whose slots have survival
    probabilities `survival[i]` (the running product of the per-position estimates), verify the
    prefix of length `n` that maximises the tokens the verification is expected to yield,
    `1 + sum(survival[:n])`, over what the round costs, `round_costs[n]` (the whole block's
    drafting plus the verification of `n` drafted tokens). Ties go to the shorter prefix."""
    best, best_rate, expected = 0, -1.0, 1.0
    for n, cost in enumerate(round_costs[:len(survival) + 1]):
        if n:
            expected += survival[n - 1]
        if expected / cost > best_rate:
            best, best_rate = n, expected / cost
    return best
