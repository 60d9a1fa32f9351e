"""The online acceptance estimator (vLLM 0.32's, `specdecpp.engine.online`): its cold start, its labels,
its refit against a direct IRLS solve, its state on disk, and the head's online recalibration."""
from __future__ import annotations

import random

import numpy as np
import pytest
from test_benchmarks import load_benchmark

from specdecpp.engine.online import (OnlineAcceptanceEstimator, best_verify_length, log_odds, log_odds_from_log,
                                     sigmoid)


def test_cold_start_is_vllms():
    """vLLM 0.32.0's acceptance_estimator.py: _INIT_SLOPE = 0.5, _INIT_BIAS = -0.2, REFIT_INTERVAL
    100, DAMPING_OBSERVATIONS 50, L2 1e-3, _MAX_LOG_ODDS 40."""
    estimator = OnlineAcceptanceEstimator(6)
    assert estimator.slope == 0.5 and estimator.intercepts == [-0.2] * 6
    assert (estimator.refit_interval, estimator.damping, estimator.ridge) == (100, 50.0, 1e-3)
    assert estimator.predict(3, 2.0) == pytest.approx(sigmoid(0.5 * 2.0 - 0.2))
    assert log_odds(1.0) == 40.0 and log_odds(0.0) == -40.0 and log_odds(0.75) == pytest.approx(np.log(3.0))
    assert log_odds_from_log(np.log(0.75)) == pytest.approx(np.log(3.0)) and log_odds_from_log(-1e-30) == 40.0
    recalibration = OnlineAcceptanceEstimator.recalibration(4)
    assert recalibration.predict(2, 1.3) == pytest.approx(sigmoid(1.3))  # no correction until it has data


def test_labels_are_the_accepted_tokens_and_the_first_rejected_one():
    estimator = OnlineAcceptanceEstimator(5, refit_interval=1000)
    estimator.observe([1.0] * 5, [0.5] * 5, num_verified=5, num_accepted=2)
    assert [s[5] for s in estimator.window] == [1, 1, 1, 0, 0]
    assert [s[4] for s in estimator.window] == [0.5, 0.5, -0.5, 0, 0]  # y - p
    estimator.observe([1.0] * 5, [0.5] * 5, num_verified=3, num_accepted=3)  # all accepted: no rejected token
    assert [s[5] for s in estimator.window] == [2, 2, 2, 0, 0]
    estimator.observe([1.0] * 2, [0.5] * 2, num_verified=4, num_accepted=3)  # only the judged ones
    assert [s[5] for s in estimator.window] == [3, 3, 2, 0, 0]


def recorded_rounds(num_rounds: int, num_positions: int, seed: int = 0) -> list[tuple[list[float], int, int]]:
    """Made-up verification outcomes: per round the drafted tokens' features, how many were
    verified and how many accepted (acceptance grows with the feature)."""
    rng = random.Random(seed)
    rounds = []
    for _ in range(num_rounds):
        drafted = rng.randint(1, num_positions)
        features = [rng.gauss(1.0, 2.5) for _ in range(drafted)]
        accepted = 0
        while accepted < drafted and rng.random() < sigmoid(0.9 * features[accepted] + 0.4 - 0.3 * accepted):
            accepted += 1
        rounds.append((features, drafted, accepted))
    return rounds


def direct_newton_step(observations: list[tuple[int, float, float, float]], num_positions: int,
                       ridge: float) -> np.ndarray:
    """The undamped Newton step of the window: solve `(X^T W X + ridge I) d = X^T (y - p)` with
    the full design matrix, rows `[f, e_k]`, `W = p (1 - p)`."""
    x = np.zeros((len(observations), 1 + num_positions))
    w, r = np.zeros(len(observations)), np.zeros(len(observations))
    for i, (k, f, p, y) in enumerate(observations):
        x[i, 0], x[i, 1 + k] = f, 1.0
        w[i], r[i] = p * (1 - p), y - p
    return np.linalg.solve(x.T @ (w[:, None] * x) + ridge * np.eye(1 + num_positions), x.T @ r)


@pytest.mark.parametrize("damping", [0.0, 50.0])
def test_refit_matches_a_direct_irls_solve(damping):
    """On a recorded sequence of outcomes, every refit equals one Newton step solved directly on
    that window's observations: the full step without damping; with damping, the slope's step
    scaled by N / (N + 50) and each intercept's Newton step given it, scaled by n_k / (n_k + 50)."""
    positions, interval = 6, 25
    estimator = OnlineAcceptanceEstimator(positions, refit_interval=interval, damping=damping)
    window: list[tuple[int, float, float, float]] = []
    refits = 0
    for features, verified, accepted in recorded_rounds(4 * interval, positions):
        predictions = [estimator.predict(k, f) for k, f in enumerate(features)]
        window += [(k, f, p, float(k < accepted)) for k, (f, p) in enumerate(zip(features, predictions))
                   if k <= accepted and k < verified]
        slope, intercepts = estimator.slope, np.array(estimator.intercepts)
        estimator.observe(features, predictions, verified, accepted)
        if estimator.refits == refits:
            continue
        refits += 1
        step = direct_newton_step(window, positions, estimator.ridge)
        counts = np.bincount([k for k, *_ in window], minlength=positions).astype(float)
        if damping == 0.0:
            expected_slope, expected_intercepts = slope + step[0], intercepts + step[1:]
        else:
            step_w = step[0] * len(window) / (len(window) + damping)
            expected_slope = slope + step_w
            info = np.zeros((positions, 3))  # per position: sum w f, sum w, sum (y - p)
            for k, f, p, y in window:
                info[k] += (p * (1 - p) * f, p * (1 - p), y - p)
            expected_intercepts = intercepts + (info[:, 2] - info[:, 0] * step_w) / (info[:, 1] + estimator.ridge) \
                * counts / (counts + damping)
        assert expected_slope >= 0
        assert estimator.slope == pytest.approx(expected_slope, abs=1e-5)
        np.testing.assert_allclose(estimator.intercepts, expected_intercepts, atol=1e-5)
        assert all(s == [0.0] * 6 for s in estimator.window)  # each refit fits its own window
        window = []
    assert refits == 4


def test_the_slope_never_goes_negative():
    estimator = OnlineAcceptanceEstimator(2, refit_interval=50)
    for _ in range(50):  # confident drafts rejected, doubtful ones accepted: the data want a negative slope
        for feature, accepted in ((5.0, 0), (-5.0, 1)):
            estimator.observe([feature], [estimator.predict(0, feature)], 1, accepted)
    assert estimator.refits == 2 and estimator.slope >= 0.0


def test_offline_fit_converges_to_the_maximum_likelihood():
    rounds = recorded_rounds(600, 4, seed=3)
    observations = [(k, f, float(k < accepted)) for features, verified, accepted in rounds
                    for k, f in enumerate(features) if k <= accepted and k < verified]
    fitted = load_benchmark("online_estimators").fit_offline(observations, 4)
    assert not fitted.learn
    p = np.array([fitted.predict(k, f) for k, f, _ in observations])
    labels = np.array([y for *_, y in observations])
    features = np.array([f for _, f, _ in observations])
    assert abs(((labels - p) * features).sum()) < 1e-6  # the score vanishes at the optimum
    for k in range(4):
        at_k = np.array([position == k for position, *_ in observations])
        assert abs((labels - p)[at_k].sum()) < 1e-6
    assert 0.6 < fitted.slope < 1.2  # the generating slope is 0.9


def test_state_saves_and_loads(tmp_path):
    estimator = OnlineAcceptanceEstimator.recalibration(3, refit_interval=2)
    for features, verified, accepted in recorded_rounds(5, 3):
        estimator.observe(features, [estimator.predict(k, f) for k, f in enumerate(features)], verified, accepted)
    estimator.save(tmp_path)  # a folder: the head folder's file
    assert OnlineAcceptanceEstimator.load(tmp_path) == estimator
    estimator.save(tmp_path / "state.json")
    assert OnlineAcceptanceEstimator.load(tmp_path / "state.json") == estimator


def recalibrated(shift: float, rounds: int, seed: int, positions: int = 6) -> tuple[OnlineAcceptanceEstimator, int]:
    """Online recalibration of a head whose logit `z` is too high by `shift` (the target accepts
    with `sigmoid(z - shift)`), over rounds stopped by the product rule at 0.5. Returns the
    recalibration and how many tokens were judged."""
    rng = random.Random(seed)
    estimator = OnlineAcceptanceEstimator.recalibration(positions)
    judged = 0
    for _ in range(rounds):
        logits, predictions, p_all = [], [], 1.0
        while len(logits) < positions and 1 - p_all <= 0.5:
            logits.append(rng.gauss(1.5, 2.0))
            predictions.append(estimator.predict(len(logits) - 1, logits[-1]))
            p_all *= predictions[-1]
        accepted = 0
        while accepted < len(logits) and rng.random() < sigmoid(logits[accepted] - shift):
            accepted += 1
        estimator.observe(logits, predictions, len(logits), accepted)
        judged += len(logits)
    return estimator, judged


def mean_correction(estimator: OnlineAcceptanceEstimator, position: int = 0) -> float:
    """How far the recalibration moves the head's logit, on average over the logits it sees."""
    rng = random.Random(9)
    logits = [rng.gauss(1.5, 2.0) for _ in range(2000)]
    return float(np.mean([estimator.slope * z + estimator.intercepts[position] - z for z in logits]))


def test_recalibration_of_a_calibrated_head_stays_near_no_correction():
    for seed in range(3):
        estimator, judged = recalibrated(0.0, 300, seed)
        assert judged > 700 and estimator.refits == 3
        assert abs(mean_correction(estimator)) < 0.75, seed  # noise of one window's fit, no drift


def test_recalibration_recovers_a_shifted_head_within_a_few_hundred_tokens():
    for seed in range(3):
        estimator, judged = recalibrated(2.0, 200, seed)
        assert judged < 500
        assert -2.6 < mean_correction(estimator) < -1.4, seed  # at least 70% of the +2 shift undone


def test_best_verify_length_is_the_brute_force_argmax():
    rng = random.Random(5)
    for _ in range(200):
        drafted = rng.randint(0, 8)
        survival = list(np.cumprod([rng.random() for _ in range(drafted)]))
        verify = np.cumsum([rng.uniform(0.5, 2.0)] + [rng.uniform(0.0, 0.8) for _ in range(drafted)])
        drafting = rng.uniform(0.0, 3.0)
        gains = [(1 + sum(survival[:n])) / (drafting + verify[n]) for n in range(drafted + 1)]
        assert best_verify_length(survival, [drafting + v for v in verify]) == int(np.argmax(gains))
