"""Candidate-length schedules: how many tokens the draft proposes in each round.

Every schedule is a small policy behind one interface, so the decode loop never branches on a
schedule's name and a new schedule is one class:

- `start_round()` — where a round starts: the schedule begins the round's state;
- `max_draft()` — the most tokens this round may draft (a query: it changes nothing);
- `stop_after(step)` — after each drafted token, whether to stop drafting now;
- `verify_length(num_drafted)` — after drafting, how many of the drafted tokens the target
  verifies (all, but for the budget schedules);
- `end_round(num_verified, num_accepted)` — after verification, to adapt for the next round.

A schedule object holds the state of one generation; `make_schedule` builds a fresh one. The
online schedules (`online`, and `ada` with `online=True`) also hold an `OnlineAcceptanceEstimator`
(`specdecpp.engine.online`) that learns from `end_round`'s outcomes: fresh per generation unless the
settings pass one in, which then carries its learning across generations.
"""
from __future__ import annotations

import math

import torch

from specdecpp.costs import StepTimes
from specdecpp.engine.draft_step import DraftStep
from specdecpp.engine.online import MAX_LOG_ODDS, OnlineAcceptanceEstimator, best_verify_length, clamp_log_odds, log_odds
from specdecpp.engine.settings import SCHEDULES, DecodingSettings
from specdecpp.head.model import AcceptancePredictionHead, LeanJudge, step_features


class Schedule:
    """Base policy: draft up to `max_draft()` tokens, never stop early, never adapt."""

    needs_hidden_states = False

    def start_round(self) -> None:
        """A round starts (before its `max_draft` and first `stop_after`)."""

    def max_draft(self) -> int:
        raise NotImplementedError

    def stop_after(self, step: DraftStep) -> bool:
        return False

    def verify_length(self, num_drafted: int) -> int:
        """How many of the round's `num_drafted` tokens go to the target: all of them."""
        return num_drafted

    def end_round(self, num_drafted: int, num_accepted: int) -> None:
        """The target verified the first `num_drafted` drafted tokens and accepted `num_accepted`."""


class NoDraft(Schedule):
    """`none`: the target alone, one token per round (the baseline, through the same loop)."""

    def max_draft(self) -> int:
        return 0


class Constant(Schedule):
    """`constant`: exactly `num_assistant_tokens` per round (Leviathan et al.)."""

    def __init__(self, num_assistant_tokens: int):
        self.k = num_assistant_tokens

    def max_draft(self) -> int:
        return self.k


class Heuristic(Constant):
    """`heuristic`, Hugging Face's: K += 2 after a fully accepted round, else K = max(1, K - 1)."""

    def end_round(self, num_drafted: int, num_accepted: int) -> None:
        self.k = self.k + 2 if num_accepted == num_drafted else max(1, self.k - 1)


class Dynamic(Constant):
    """`dynamic`, Hugging Face's default since 4.45: at most `num_assistant_tokens`, and stop as
    soon as the draft's probability of the token it just drafted (its top token, greedy) falls
    below `assistant_confidence_threshold` — that token still goes to the target, as in HF."""

    def __init__(self, num_assistant_tokens: int, assistant_confidence_threshold: float):
        super().__init__(num_assistant_tokens)
        self.threshold = assistant_confidence_threshold

    def stop_after(self, step: DraftStep) -> bool:
        return step.token_prob < self.threshold


class ProductRule(Schedule):
    """The stop rule of `ada` and `online`: keep `P(all accepted) = prod p_hat_i` over the drafted
    tokens judged so far and stop once `1 - P(all accepted) > stop_threshold`, within
    `bound = (min, max)`. With an `estimator`, the `p_hat_i` it gives (`learned`) are recorded
    with their features, and `end_round` teaches it the round's outcomes."""

    def __init__(self, stop_threshold: float, bound: tuple[int, int],
                 estimator: OnlineAcceptanceEstimator | None = None):
        self.stop_threshold = stop_threshold
        self.min_draft, self.max_k = bound
        self.estimator = estimator
        self.start_round()

    def start_round(self) -> None:
        """The product starts from certainty, and no token of the new round is judged yet."""
        self.p_all_accepted = 1.0
        self.features, self.predictions = [], []

    def max_draft(self) -> int:
        return self.max_k

    def learned(self, feature: float) -> float:
        """The estimator's P(accept) of the next judged token (its position: how many this round
        judged before it) given its `feature`, recorded for `end_round`."""
        p = self.estimator.predict(len(self.features), feature)
        self.features.append(feature)
        self.predictions.append(p)
        return p

    def judged(self, p_accept: float, num_drafted: int) -> bool:
        """Fold one judgement into the product; whether to stop after `num_drafted` tokens."""
        self.p_all_accepted *= p_accept
        return num_drafted >= self.min_draft and 1.0 - self.p_all_accepted > self.stop_threshold

    def end_round(self, num_drafted: int, num_accepted: int) -> None:
        if self.estimator is not None:
            self.estimator.observe(self.features, self.predictions, num_drafted, num_accepted)


class Ada(ProductRule):
    """`ada`, SpecDec++: the product rule (`ProductRule`) over the head's judgements. Which
    tokens are judged when is the head's alignment: a `proposer` head judges `y_j` from the
    forward that proposed it (its state plus features of its logits), right after drafting it; a
    `reader` head judges `y_{j-1}` from the state that proposes `y_j`, and the last verified
    token's state (seen at `j == 1`) counts as accepted with probability 1. With a `recalibration`
    estimator (`online=True`) the head's logit `z` becomes `sigmoid(s * z + b_k)`, `s` and `b_k`
    learned online from the rounds' outcomes (`OnlineAcceptanceEstimator.recalibration`)."""

    needs_hidden_states = True

    def __init__(self, head: AcceptancePredictionHead, stop_threshold: float, bound: tuple[int, int],
                 recalibration: OnlineAcceptanceEstimator | None = None):
        super().__init__(stop_threshold, bound, recalibration)
        self.head_features = head.features
        self.needs_hidden_states = head.reads_hidden_states
        self.judge_state = LeanJudge(head)
        self.judges_proposed_token = head.alignment == "proposer"

    def stop_after(self, step: DraftStep) -> bool:
        if not self.judges_proposed_token and step.num_drafted == 1:
            return self.judged(1.0, step.num_drafted)  # a reader's first state judges the last verified token
        p_accept = self.judge(step)
        if self.estimator is not None:
            p_accept = self.learned(log_odds(p_accept))
        return self.judged(p_accept, step.num_drafted)

    def judge(self, step: DraftStep) -> float:
        """The head's P(accept) from what `step` computed: the judgement the step made itself (the
        compiled draft graph), else the head's judgement of the step's state and, for a head with
        features, of the features of the token it drafted (from the softmax the step computed)."""
        if step.accept_prob is not None:
            return step.accept_prob
        features = step_features(step.logits, step.raw_probs, step.token, self.head_features) \
            if self.head_features else ()
        return self.judge_state(step.hidden, features)


class Online(ProductRule):
    """`online`: vLLM 0.32's `OnlineAcceptanceEstimator` (`specdecpp.engine.online`) under our product
    rule. Each drafted token is judged `sigmoid(w * f + b_k)` from `f = draft_log_odds(step)`,
    the log-odds of the draft's top probability (a function of the prefix, not of the drawn
    token), and the estimator learns from every round's outcome."""

    def __init__(self, estimator: OnlineAcceptanceEstimator, stop_threshold: float, bound: tuple[int, int],
                 temperature: float = 1.0):
        super().__init__(stop_threshold, bound, estimator)
        self.temperature = temperature

    def stop_after(self, step: DraftStep) -> bool:
        return self.judged(self.learned(draft_log_odds(step, self.temperature)), step.num_drafted)


def draft_log_odds(step: DraftStep, temperature: float = 1.0) -> float:
    """vLLM's feature: `logit(max q)`, q the draft's distribution at `temperature` (1 for greedy),
    as `m - log(sum over the other tokens of exp(l - m))` of the scaled logits `l` (max `m`),
    clamped to +-40. From the step's raw logits when it has them; the compiled step hands only its
    distribution (`probs`: equal unless top-k or top-p filtered it), whose top probability then
    gives it."""
    if step.logits is not None:
        scaled = step.logits.double() / temperature
        others = float(torch.exp(scaled - scaled.max()).sum()) - 1.0
        return clamp_log_odds(-math.log(others)) if others > 0.0 else MAX_LOG_ODDS
    return log_odds(float(step.probs.max()) if step.probs is not None else step.token_prob)


class VerifyBudget(Schedule):
    """`verify-budget` and `ada-budget`: vLLM 0.32's adaptive verification at batch 1. A round drafts
    a block of `num_tokens` tokens, scoring each as `scorer` (`Online` for `verify-budget`, `Ada`
    with a proposer head for `ada-budget`) judges it, and keeps its running product: slot j's
    survival. Then the target verifies the prefix whose expected tokens per round time is highest
    (`online.best_verify_length`), each length priced with `times`: the whole block's draft steps,
    its judgements when `judged`, and the verification of that prefix. The scorer's own stop
    decisions are ignored, and it learns only from the verified tokens' outcomes."""

    def __init__(self, scorer: ProductRule, num_tokens: int, times: StepTimes, judged: bool):
        self.scorer, self.num_tokens, self.times, self.judged = scorer, num_tokens, times, judged
        self.needs_hidden_states = scorer.needs_hidden_states
        self.start_round()

    def start_round(self) -> None:
        self.scorer.start_round()
        self.survival = []

    def max_draft(self) -> int:
        return self.num_tokens

    def stop_after(self, step: DraftStep) -> bool:
        self.scorer.stop_after(step)
        self.survival.append(self.scorer.p_all_accepted)
        return False

    def verify_length(self, num_drafted: int) -> int:
        """The prefix of the `num_drafted` tokens worth verifying at these step times."""
        judged = num_drafted if self.judged else 0
        costs = [self.times.round_ms(num_drafted, judged, n) for n in range(num_drafted + 1)]
        return best_verify_length(self.survival[:num_drafted], costs)

    def end_round(self, num_drafted: int, num_accepted: int) -> None:
        self.scorer.end_round(num_drafted, num_accepted)


class Oracle(Schedule):
    """`oracle` (greedy only, for measurement): each round drafts exactly the tokens the target
    will accept. `draft_correct[i]` says whether the draft's greedy proposal for generated
    position `i` equals the target's token there (known in advance from the target's own greedy
    output); the round at position `pos` drafts the run of correct proposals starting there."""

    def __init__(self, draft_correct: list[bool], max_k: int):
        self.draft_correct = draft_correct
        self.max_k = max_k
        self.position = 0

    def max_draft(self) -> int:
        run = 0
        while run < self.max_k and self.position + run < len(self.draft_correct) and self.draft_correct[self.position + run]:
            run += 1
        return run

    def end_round(self, num_drafted: int, num_accepted: int) -> None:
        self.position += num_accepted + 1


def make_schedule(settings: DecodingSettings | str, *, draft_correct: list[bool] | None = None,
                  **knobs) -> Schedule:
    """A fresh policy for one generation: the schedule of `settings` (a `DecodingSettings`, or a
    schedule name with the knobs as keyword arguments: `head`, `stop_threshold`, `bound`,
    `num_assistant_tokens`, `assistant_confidence_threshold`, `online`, `estimator`, `step_times`;
    see `SCHEDULES`). Knobs a schedule does not use are ignored; `oracle` needs `draft_correct` (see
    `Oracle`); `ada` takes `stop_threshold="auto"` for the threshold stored in the head, and with
    `online=True` recalibrates the head online (`settings.estimator`, else a fresh
    recalibration); `online` learns in `settings.estimator`, else in a fresh estimator, and so does
    `verify-budget`, which, like `ada-budget`, drafts blocks of `num_assistant_tokens` and prices
    its verifications with `settings.budget_step_times()`."""
    if isinstance(settings, str):
        settings = DecodingSettings(schedule=settings, **knobs)
    name = settings.schedule
    if name == "none":
        return NoDraft()
    if name == "constant":
        return Constant(settings.num_assistant_tokens)
    if name == "heuristic":
        return Heuristic(settings.num_assistant_tokens)
    if name == "dynamic":
        return Dynamic(settings.num_assistant_tokens, settings.assistant_confidence_threshold)
    bound = tuple(settings.bound)
    if name == "ada":
        head = settings.head
        recalibration = None
        if settings.online:
            recalibration = settings.estimator if settings.estimator is not None \
                else OnlineAcceptanceEstimator.recalibration(bound[1])
        return Ada(head, head.resolve_stop_threshold(settings.stop_threshold), bound, recalibration)
    if name == "online":
        estimator = settings.estimator if settings.estimator is not None else OnlineAcceptanceEstimator(bound[1])
        return Online(estimator, settings.stop_threshold, bound, settings.temperature if settings.do_sample else 1.0)
    if name == "oracle":
        return Oracle(draft_correct, settings.bound[1])
    if name in ("verify-budget", "ada-budget"):
        # The scorer's stop rule never fires (a threshold of 1) within a bound of the whole block.
        k = settings.num_assistant_tokens
        if name == "ada-budget":
            scorer = Ada(settings.head, 1.0, (k, k))
        else:
            estimator = settings.estimator if settings.estimator is not None else OnlineAcceptanceEstimator(k)
            scorer = Online(estimator, 1.0, (k, k))
        return VerifyBudget(scorer, k, settings.budget_step_times(), judged=name == "ada-budget")
    raise ValueError(f"unknown schedule {name!r}; choose from {', '.join(SCHEDULES)}")
