"""Candidate-length schedules: how many tokens the draft proposes in each round.

A schedule is one class: a policy behind `start_round`, `max_draft`, `stop_after(step)`,
`verify_length(num_drafted)` and `end_round(num_verified, num_accepted)`, holding one generation's
state, with its capabilities as class attributes. A class that sets `name` is in `SCHEDULES`.
"""
from __future__ import annotations

import math
from typing import ClassVar

import torch

from specdecpp.engine.online import (MAX_LOG_ODDS, OnlineAcceptanceEstimator, best_verify_length, clamp_log_odds,
                                     log_odds)
from specdecpp.engine.sampling import DraftStep
from specdecpp.head.model import AcceptancePredictionHead
from specdecpp.costs import StepTimes

SCHEDULES: dict[str, type[Schedule]] = {}


class Schedule:
    """Base policy: draft up to `max_draft()` tokens, never stop early, never adapt."""

    name: ClassVar[str | None] = None
    needs_draft: ClassVar[bool] = True
    needs_head: ClassVar[bool] = False  # judges with `settings.head`
    greedy_only: ClassVar[bool] = False
    reads_k: ClassVar[bool] = False  # reads `num_assistant_tokens`
    needs_step_times: ClassVar[bool] = False  # prices verifications with `settings.budget_step_times()`
    recalibrates: ClassVar[bool] = False  # takes `online=True`
    knows_target: ClassVar[bool] = False  # built with the target's own output (`draft_correct`)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            SCHEDULES[cls.name] = cls

    @classmethod
    def from_settings(cls, settings, draft_correct: list[bool] | None = None) -> Schedule:
        raise NotImplementedError

    @classmethod
    def estimator_positions(cls, settings) -> int | None:
        """The draft positions an estimator of this schedule covers, or None: it learns nothing."""
        return None

    @classmethod
    def new_estimator(cls, settings) -> OnlineAcceptanceEstimator | None:
        """A cold-start estimator for a generation of this schedule, or None."""
        positions = cls.estimator_positions(settings)
        return None if positions is None else OnlineAcceptanceEstimator(positions)

    @classmethod
    def estimator_for(cls, settings) -> OnlineAcceptanceEstimator | None:
        """`settings.estimator` (which carries learning across generations), else `new_estimator`."""
        return settings.estimator if settings.estimator is not None else cls.new_estimator(settings)

    @classmethod
    def check(cls, settings, name) -> None:
        """ValueError for settings this schedule refuses beyond its capabilities (`name` spells a setting)."""

    @classmethod
    def check_head(cls, settings) -> None:
        """ValueError unless `settings.head` suits this schedule (called with a head that fits the draft)."""

    def start_round(self) -> None:
        """A round starts (before its `max_draft` and first `stop_after`)."""

    def max_draft(self) -> int:
        raise NotImplementedError

    def stop_after(self, step: DraftStep) -> bool:
        return False

    def verify_length(self, num_drafted: int) -> int:
        """How many of the round's `num_drafted` tokens go to the target: all of them."""
        return num_drafted

    def end_round(self, num_verified: int, num_accepted: int) -> None:
        """The target verified `num_verified` drafted tokens and accepted `num_accepted`."""


class NoDraft(Schedule):
    """`none`: the target alone, one token per round."""

    name = "none"
    needs_draft = False

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        return cls()

    def max_draft(self) -> int:
        return 0


class Constant(Schedule):
    """`constant`: exactly `num_assistant_tokens` per round (Leviathan et al.)."""

    name = "constant"
    reads_k = True

    def __init__(self, num_assistant_tokens: int):
        self.k = num_assistant_tokens

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        return cls(settings.num_assistant_tokens)

    def max_draft(self) -> int:
        return self.k


class Heuristic(Constant):
    """`heuristic`, Hugging Face's: K += 2 after a fully accepted round, else K = max(1, K - 1)."""

    name = "heuristic"

    def end_round(self, num_verified: int, num_accepted: int) -> None:
        self.k = self.k + 2 if num_accepted == num_verified else max(1, self.k - 1)


class Dynamic(Constant):
    """`dynamic`, Hugging Face's default: at most `num_assistant_tokens`, stopping after a drafted
    token whose draft probability is below `assistant_confidence_threshold` (that token is verified)."""

    name = "dynamic"

    def __init__(self, num_assistant_tokens: int, assistant_confidence_threshold: float):
        super().__init__(num_assistant_tokens)
        self.threshold = assistant_confidence_threshold

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        return cls(settings.num_assistant_tokens, settings.assistant_confidence_threshold)

    def stop_after(self, step: DraftStep) -> bool:
        return step.token_prob < self.threshold


class Judge:
    """P(accept) of each token a round judges: `value(step)` (the step's own `accept_prob` here, as
    the draft steps and the replay hand it) or, with an `estimator`, the estimator's prediction from
    that value as its feature, learned from each round's outcome. A step whose value is None judges
    nothing (P = 1)."""

    def __init__(self, estimator: OnlineAcceptanceEstimator | None = None):
        self.estimator = estimator
        self.start_round()

    def start_round(self) -> None:
        self.features, self.predictions = [], []

    def __call__(self, step: DraftStep) -> float:
        value = self.value(step)
        if value is None:
            return 1.0
        if self.estimator is None:
            return value
        p = self.estimator.predict(len(self.features), value)
        self.features.append(value)
        self.predictions.append(p)
        return p

    def value(self, step: DraftStep) -> float | None:
        return step.accept_prob

    def end_round(self, num_verified: int, num_accepted: int) -> None:
        if self.estimator is not None:
            self.estimator.observe(self.features, self.predictions, num_verified, num_accepted)


class HeadJudge(Judge):
    """The head's P(accept), as the draft step judged it (its logit the feature of a recalibrating
    `estimator`). A `proposer` head judges `y_j` from the step that drafted it; a `reader` head judges
    `y_{j-1}` from the step that drafts `y_j`, the last verified token (at `j == 1`) counting as accepted."""

    def __init__(self, head: AcceptancePredictionHead, estimator: OnlineAcceptanceEstimator | None = None):
        self.reader = head.alignment != "proposer"
        super().__init__(estimator)

    def value(self, step: DraftStep) -> float | None:
        if self.reader and step.num_drafted == 1:
            return None
        return step.accept_prob if self.estimator is None else log_odds(step.accept_prob)


class DraftConfidence(Judge):
    """vLLM's online estimator judging from `draft_log_odds(step, temperature)`."""

    def __init__(self, estimator: OnlineAcceptanceEstimator, temperature: float = 1.0):
        super().__init__(estimator)
        self.temperature = temperature

    def value(self, step: DraftStep) -> float:
        return draft_log_odds(step, self.temperature)


def draft_log_odds(step: DraftStep, temperature: float = 1.0) -> float:
    """vLLM's feature `logit(max q)`, q the draft's raw distribution at `temperature`, clamped to
    +-40; from the step's distribution when it hands no logits (the compiled step)."""
    if step.logits is not None:
        scaled = step.logits.double() / temperature
        others = float(torch.exp(scaled - scaled.max()).sum()) - 1.0
        return clamp_log_odds(-math.log(others)) if others > 0.0 else MAX_LOG_ODDS
    return log_odds(float(step.probs.max()) if step.probs is not None else step.token_prob)


class ProductRule(Schedule):
    """Stop once `1 - prod p_hat > stop_threshold` over the judged tokens, `p_hat` from `judge`,
    drafting at least `min` and at most `max` tokens (`bound`)."""

    def __init__(self, judge: Judge, stop_threshold: float, bound: tuple[int, int]):
        self.judge, self.stop_threshold = judge, stop_threshold
        self.min_draft, self.max_k = bound
        self.p_all_accepted = 1.0

    def start_round(self) -> None:
        self.p_all_accepted = 1.0
        self.judge.start_round()

    def max_draft(self) -> int:
        return self.max_k

    def threshold(self, num_drafted: int) -> float:
        return self.stop_threshold

    def stop_after(self, step: DraftStep) -> bool:
        self.p_all_accepted *= self.judge(step)
        return step.num_drafted >= self.min_draft and 1.0 - self.p_all_accepted > self.threshold(step.num_drafted)

    def end_round(self, num_verified: int, num_accepted: int) -> None:
        self.judge.end_round(num_verified, num_accepted)


class Ada(ProductRule):
    """`ada`, SpecDec++: the product rule over the head's judgements, optionally recalibrated online."""

    name = "ada"
    needs_head = recalibrates = True

    def __init__(self, head: AcceptancePredictionHead, stop_threshold: float, bound: tuple[int, int],
                 recalibration: OnlineAcceptanceEstimator | None = None):
        super().__init__(HeadJudge(head, recalibration), stop_threshold, bound)

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        threshold = settings.head.resolve_stop_threshold(settings.stop_threshold, settings.step_times)
        return cls(settings.head, threshold, tuple(settings.bound), cls.estimator_for(settings) if settings.online else None)

    @classmethod
    def estimator_positions(cls, settings):
        return settings.bound[1] if settings.online else None

    @classmethod
    def new_estimator(cls, settings):
        return OnlineAcceptanceEstimator.recalibration(settings.bound[1]) if settings.online else None

    @classmethod
    def check_head(cls, settings):
        settings.head.resolve_stop_threshold(settings.stop_threshold)
        if settings.stop_threshold == "auto":
            settings.warn_on_threshold_mismatch()


class Online(ProductRule):
    """`online`: vLLM's online acceptance estimator under the product rule."""

    name = "online"

    def __init__(self, estimator: OnlineAcceptanceEstimator, stop_threshold: float, bound: tuple[int, int],
                 temperature: float = 1.0):
        super().__init__(DraftConfidence(estimator, temperature), stop_threshold, bound)

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        return cls(cls.estimator_for(settings), settings.stop_threshold, tuple(settings.bound),
                   settings.temperature if settings.do_sample else 1.0)

    @classmethod
    def estimator_positions(cls, settings):
        return settings.bound[1]

    @classmethod
    def check(cls, settings, name):
        if settings.stop_threshold == "auto":
            raise ValueError(f"schedule 'online' has no stored threshold: give {name('stop_threshold')} a number "
                             "(calibration --choose_threshold reports the best one on records)")


class VerifyBudget(Schedule):
    """`verify-budget`, vLLM's adaptive verification at batch 1: draft a block of `num_tokens`,
    keep each slot's survival (the running product of `judge`'s scores) and verify the prefix with
    the most expected tokens per round time at `times` (its judgements priced when `judged`)."""

    name = "verify-budget"
    greedy_only = reads_k = needs_step_times = True

    def __init__(self, judge: Judge, num_tokens: int, times: StepTimes, judged: bool):
        self.judge, self.num_tokens, self.times, self.judged = judge, num_tokens, times, judged
        self.survival = []

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        judge = DraftConfidence(cls.estimator_for(settings))
        return cls(judge, settings.num_assistant_tokens, settings.budget_step_times(), judged=False)

    @classmethod
    def estimator_positions(cls, settings):
        return settings.num_assistant_tokens

    def start_round(self) -> None:
        self.judge.start_round()
        self.survival = []

    def max_draft(self) -> int:
        return self.num_tokens

    def stop_after(self, step: DraftStep) -> bool:
        self.survival.append((self.survival[-1] if self.survival else 1.0) * self.judge(step))
        return False

    def verify_length(self, num_drafted: int) -> int:
        judged = num_drafted if self.judged else 0
        costs = [self.times.round_ms(num_drafted, judged, n) for n in range(num_drafted + 1)]
        return best_verify_length(self.survival[:num_drafted], costs)

    def end_round(self, num_verified: int, num_accepted: int) -> None:
        self.judge.end_round(num_verified, num_accepted)


class AdaBudget(VerifyBudget):
    """`ada-budget`: `verify-budget` scored by a proposer head."""

    name = "ada-budget"
    needs_head = True

    def __init__(self, head: AcceptancePredictionHead, num_tokens: int, times: StepTimes):
        super().__init__(HeadJudge(head), num_tokens, times, judged=True)

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        return cls(settings.head, settings.num_assistant_tokens, settings.budget_step_times())

    @classmethod
    def estimator_positions(cls, settings):
        return None

    @classmethod
    def check_head(cls, settings):
        if settings.head.alignment != "proposer":
            # A reader head judges y_j only from the step that drafts y_{j+1}: a block's last token would go unscored.
            raise ValueError("schedule 'ada-budget' needs a proposer head, which scores every drafted token of the "
                             "block when it drafts it; this head is a reader")


class Oracle(Schedule):
    """`oracle` (greedy, for measurement): each round drafts exactly the tokens the target will
    accept; `draft_correct[i]` says whether the draft's greedy proposal at generated position `i`
    is the target's token."""

    name = "oracle"
    greedy_only = knows_target = True

    def __init__(self, draft_correct: list[bool], max_k: int):
        self.draft_correct, self.max_k, self.position = draft_correct, max_k, 0

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        return cls(draft_correct, settings.bound[1])

    def max_draft(self) -> int:
        run, correct = 0, self.draft_correct[self.position:]
        while run < min(self.max_k, len(correct)) and correct[run]:
            run += 1
        return run

    def end_round(self, num_verified: int, num_accepted: int) -> None:
        self.position += num_accepted + 1


def make_schedule(settings, draft_correct: list[bool] | None = None) -> Schedule:
    """A fresh policy for one generation of `settings` (validated; what is left out, the head's); `oracle` needs
    `draft_correct`."""
    return SCHEDULES[settings.schedule].from_settings(settings.with_head_defaults(), draft_correct)
