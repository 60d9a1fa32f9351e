"""Candidate-length schedules: how many tokens the draft proposes in each round.

A schedule is one class: a policy behind `start_round`, `max_draft`, `stop_after`, `verify_length` and `end_round`,
holding one generation's state, its capabilities as class attributes. A class that sets `name` is in `SCHEDULES`."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import ClassVar

import torch

from specdecpp.engine.online import (MAX_LOG_ODDS, OnlineAcceptanceEstimator, best_verify_length, clamp_log_odds,
                                     log_odds)
from specdecpp.engine.sampling import DraftStep
from specdecpp.head.model import AcceptancePredictionHead, LeanJudge
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
    grows_tree: ClassVar[bool] = False  # drafts a token tree (`tree.grow_tree`), not a chain
    proposer_only: ClassVar[str | None] = None  # set: refuses reader heads, saying what its proposer head does

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
        if cls.proposer_only is not None and settings.head.alignment != "proposer":
            raise ValueError(f"schedule '{cls.name}' needs a proposer head, which {cls.proposer_only}; this head is a "
                             "reader")

    @classmethod
    def prices_rounds(cls, settings) -> bool:
        """Whether these settings price rounds with measured step times (`settings.budget_step_times()`)."""
        return cls.needs_step_times

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
    """`dynamic`, Hugging Face's default: up to `num_assistant_tokens`, stopping after one under the confidence."""

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
    """P(accept) of each token a round judges: `value(step)` (here the step's `accept_prob`; None: P = 1) or, with an
    `estimator`, its prediction from that value as its feature, learned from each round's outcome."""

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
    """The head's P(accept) as the draft step judged it (its logit the feature of a recalibrating `estimator`); a
    `reader` head judges `y_{j-1}` from the step that drafts `y_j`, the last verified token counting as accepted."""

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
    """vLLM's feature `logit(max q)`, q the draft's raw distribution at `temperature`, clamped to +-40."""
    if step.logits is not None:
        scaled = step.logits.double() / temperature
        others = float(torch.exp(scaled - scaled.max()).sum()) - 1.0
        return clamp_log_odds(-math.log(others)) if others > 0.0 else MAX_LOG_ODDS
    return log_odds(float(step.probs.max()) if step.probs is not None else step.token_prob)


class ProductRule(Schedule):
    """Stop once `1 - prod p_hat > stop_threshold` (`p_hat` from `judge`), drafting `bound[0]` to `bound[1]` tokens."""

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
    """`verify-budget`, vLLM's adaptive verification at batch 1: draft `num_tokens`, verify the prefix with the most
    expected tokens (survival: the running product of `judge`'s scores) per round time at `times`."""

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
        costs = [self.times.round_ms(num_drafted, num_drafted if self.judged else 0, n) for n in range(num_drafted + 1)]
        return best_verify_length(self.survival[:num_drafted], costs)

    def end_round(self, num_verified: int, num_accepted: int) -> None:
        self.judge.end_round(num_verified, num_accepted)


class AdaBudget(VerifyBudget):
    """`ada-budget`: `verify-budget` scored by a proposer head."""

    name = "ada-budget"
    needs_head = True
    proposer_only = "scores every drafted token of the block when it drafts it"

    def __init__(self, head: AcceptancePredictionHead, num_tokens: int, times: StepTimes):
        super().__init__(HeadJudge(head), num_tokens, times, judged=True)

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        return cls(settings.head, settings.num_assistant_tokens, settings.budget_step_times())

    @classmethod
    def estimator_positions(cls, settings):
        return None


MAX_TREE_NODES = 64  # the most nodes a tree round verifies (`tree_nodes`)
ROOT = -1  # a token tree's root: the last verified token, parent of the first level
PILOT_ROUNDS = 2  # the tree rounds an `auto`-sized `ada-tree` weighs before it may hand over to the chain


class TreeSchedule(Schedule):
    """A token tree's policy (`tree.grow_tree` drives it): each expanded node proposes `width` children, scored by
    `score_children`; `expand` picks the nodes each level expands (at least `min` levels, at most `max`: `bound`),
    `select` the candidates the target verifies (at most `tree_nodes`; `"auto"`: while each pays at `times`)."""

    grows_tree = True

    def __init__(self, width: int, tree_nodes: int | str, stop_threshold: float, bound: tuple[int, int],
                 do_sample: bool, times: StepTimes | None = None, chain: ProductRule | None = None):
        self.width, self.stop_threshold, self.do_sample, self.times = width, stop_threshold, do_sample, times
        self.base_times, self.served = times, [0.0, 0.0]  # levels after the root: ms measured, ms priced
        self.auto = tree_nodes == "auto"
        self.nodes = MAX_TREE_NODES if self.auto else tree_nodes
        self.min_draft, self.max_k = bound
        self.chain, self.tally = chain, [0, 0.0, 0.0, 0.0, 0.0]  # rounds; the trees', the chains' tokens and ms

    @classmethod
    def prices_rounds(cls, settings) -> bool:
        return settings.tree_nodes == "auto"

    def max_draft(self) -> int:
        return self.max_k

    def score_children(self, logits: torch.Tensor, probs: torch.Tensor, raw_probs: torch.Tensor | None,
                       states: torch.Tensor | None, children: torch.Tensor) -> torch.Tensor:
        """Each child's P(accept), its earlier siblings not accepted, `[nodes, width]`, for one level's nodes: node
        `i`'s raw `logits[i]`, processed `probs[i]` (`raw_probs`: None where processing changed them), state
        `states[i]` and `children[i]` in draw order (`children_scores` with this schedule's judge)."""
        return children_scores(None, self.do_sample, logits, probs, raw_probs, states, children)

    def valued(self, candidates: list, parent_value: float) -> list:
        """`candidates` (one node's children, in draw order) with their `path_value` and `value`. Sampling ranks a child
        by its chance of being tried, which its own token does not enter, so rejection sampling stays exact."""
        reach = parent_value
        for candidate in candidates:
            candidate.path_value = (reach if self.do_sample else parent_value) * candidate.score
            candidate.value = reach if self.do_sample else candidate.path_value
            reach *= 1.0 - candidate.score
        return candidates

    def expand(self, newest: list, drafted: list, widths: list[int]) -> list[int]:
        """Which of the newest level's candidates the next draft forward expands, after levels that expanded
        `widths` nodes each (the root's 1 first): the `width` most valuable whose path value keeps the product rule
        going, while a node of theirs could still enter the tree (and, `auto`, their values pay for that level)."""
        order = sorted(range(len(newest)), key=lambda i: (-newest[i].path_value, newest[i].rank))[:self.width]
        picked = [i for i in order if newest[i].depth < self.min_draft
                  or 1.0 - newest[i].path_value <= self.stop_threshold]
        if not picked:
            return []
        best = newest[picked[0]].path_value
        if sum(candidate.value > best for candidate in drafted) >= self.nodes:
            return []
        if self.auto:
            selected = self.select(drafted, widths)
            first = len(drafted) - len(newest)
            if not any(first + i in selected for i in picked):  # none of them is worth verifying: nor their children
                return []
            chosen = [drafted[i] for i in selected]
            expected = 1.0 + sum(candidate.path_value for candidate in chosen)
            spent = self.times.tree_round_ms(widths, len(chosen))
            step = self.times.level_price(len(widths), len(picked))
            if sum(newest[i].path_value for i in picked) * spent < expected * step:
                return []
        return picked

    def select(self, drafted: list, widths: list[int]) -> list[int]:
        """The drafted candidates the target verifies, parents first: the most valuable under kept parents (sampling:
        after earlier siblings), at most `tree_nodes` (`auto`: while each pays its way at the round's rate)."""
        order = sorted(range(len(drafted)), key=lambda i: (-drafted[i].value, drafted[i].depth, drafted[i].rank))
        chosen, kept, kept_ranks, expected = [], set(), set(), 1.0
        levels_ms = self.times.tree_levels_ms(widths) if self.auto else 0.0  # the same for every candidate
        for index in order:
            candidate = drafted[index]
            if len(chosen) == self.nodes:
                break
            if candidate.parent != ROOT and candidate.parent not in kept:
                continue
            if self.do_sample and candidate.rank and (candidate.parent, candidate.rank - 1) not in kept_ranks:
                continue
            if self.auto:
                spent = self.times.round_after_levels_ms(levels_ms, len(chosen))
                extra = self.times.verify_at(len(chosen) + 1) - self.times.verify_at(len(chosen))
                if candidate.value * spent < expected * extra:
                    break
            chosen.append(index)
            kept.add(index)
            kept_ranks.add((candidate.parent, candidate.rank))
            expected += candidate.path_value
        if self.auto and not self.do_sample:
            return self._cheaper_than_its_chain(drafted, chosen, widths)
        return chosen

    def _cheaper_than_its_chain(self, drafted: list, chosen: list[int], widths: list[int]) -> list[int]:
        """`chosen`, or the chain of first children inside it where the costs price that chain's expected tokens
        per millisecond higher (greedy: which nodes are verified may depend on their own scores)."""
        chain = first_children(drafted, chosen)

        def rate(nodes: list[int]) -> float:
            return (1.0 + sum(drafted[i].path_value for i in nodes)) / self.times.tree_round_ms(widths, len(nodes))

        return chain if rate(chain) > rate(chosen) else chosen

    def weigh(self, drafted: list, chosen: list[int], widths: list[int]) -> None:
        """Tally a grown round for `prefers_chain`: the tree's expected tokens and price, and those of the round
        `chain` would have drafted, the first children until its product rule stops, at the chain's step prices."""
        if self.chain is None:
            return
        survival = [drafted[i].path_value for i in first_children(drafted, range(len(drafted)))][:self.chain.max_k]
        k = next((j for j, s in enumerate(survival, 1) if j >= self.chain.min_draft
                  and 1.0 - s > self.chain.stop_threshold), len(survival))
        round_ = (1, 1.0 + sum(drafted[i].path_value for i in chosen), self.times.tree_round_ms(widths, len(chosen)),
                  1.0 + sum(survival[:k]), self.times.round_ms(k, k))
        self.tally = [total + part for total, part in zip(self.tally, round_)]

    def observe_levels(self, widths: list[int], seconds: float) -> None:
        """Take in a round's levels after its root, drafted in `seconds`: `auto` then prices levels at their timed
        prices scaled by all rounds' measured over priced (levels timed back to back miss what rounds add)."""
        if not self.auto or not self.base_times.level_ms or len(widths) < 2:
            return
        self.served[0] += 1000 * seconds
        self.served[1] += self.base_times.tree_levels_ms(widths) - self.base_times.level_price(0, widths[0])
        scale = self.served[0] / self.served[1]
        self.times = replace(self.base_times, level_ms=[ms * scale for ms in self.base_times.level_ms])

    def prefers_chain(self) -> bool:
        """Whether, over its first `PILOT_ROUNDS` rounds or more, the chain's expected tokens per millisecond beat
        the trees' (both by this schedule's own judgements and prices): the rest of the generation drafts chains."""
        rounds, tree_tokens, tree_ms, chain_tokens, chain_ms = self.tally
        return rounds >= PILOT_ROUNDS and chain_tokens * tree_ms > tree_tokens * chain_ms


class AdaTree(TreeSchedule):
    """`ada-tree`: a token tree scored by a proposer head. One of features judges each child from the parent's state;
    one of the state alone judges the first child, the rest of the rejection mass shared by draft probability."""

    name = "ada-tree"
    needs_head = True
    proposer_only = "judges each child from the state that proposes it"

    def __init__(self, head: AcceptancePredictionHead, width: int, tree_nodes: int | str, stop_threshold: float,
                 bound: tuple[int, int], do_sample: bool, times: StepTimes | None = None, chain: Ada | None = None):
        super().__init__(width, tree_nodes, stop_threshold, bound, do_sample, times, chain)
        self.judge = LeanJudge(head)

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        threshold = settings.head.resolve_stop_threshold(settings.stop_threshold, settings.step_times)
        times = settings.budget_step_times() if cls.prices_rounds(settings) else None
        chain = Ada.from_settings(settings.chain_settings()) if times is not None else None
        return cls(settings.head, settings.tree_width, settings.tree_nodes, threshold, tuple(settings.bound),
                   settings.do_sample, times, chain)

    @classmethod
    def check_head(cls, settings):
        super().check_head(settings)
        settings.head.resolve_stop_threshold(settings.stop_threshold)

    def score_children(self, logits, probs, raw_probs, states, children):
        return children_scores(self.judge, self.do_sample, logits, probs, raw_probs, states, children)


class ConfidenceTree(TreeSchedule):
    """`confidence-tree`: a token tree scored by the draft's own probabilities (EAGLE-2's and DySpec's rule)."""

    name = "confidence-tree"

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        times = settings.budget_step_times() if cls.prices_rounds(settings) else None
        return cls(settings.tree_width, settings.tree_nodes, settings.stop_threshold, tuple(settings.bound),
                   settings.do_sample, times)

    @classmethod
    def check(cls, settings, name):
        super().check(settings, name)
        if settings.stop_threshold == "auto":
            raise ValueError(f"schedule 'confidence-tree' has no stored threshold: give {name('stop_threshold')} a "
                             "number")


def first_children(drafted: list, within) -> list[int]:
    """The chain of first children from the root among the candidates `within` (indices into `drafted`)."""
    first = {drafted[i].parent: i for i in within if drafted[i].rank == 0}
    chain, node = [], ROOT
    while node in first:
        node = first[node]
        chain.append(node)
    return chain


def children_scores(judge: LeanJudge | None, do_sample: bool, logits: torch.Tensor, probs: torch.Tensor,
                    raw_probs: torch.Tensor | None, states: torch.Tensor | None, children: torch.Tensor) -> torch.Tensor:
    """`TreeSchedule.score_children` in tensor code (a graph may hold it), float64: without `judge` the draft's own
    probabilities (renormalised, sampling); a judge of features judges each child from its parent's state, one of the
    state alone the first child, the rest of the rejection mass (greedy) shared by draft probability."""
    q = probs.gather(-1, children).double()
    left = 1.0 - (q.cumsum(-1) - q)  # the draft's mass left once the earlier siblings were drawn
    drafted = q if not do_sample else torch.where(left > 0, (q / left.clamp_min(1e-300)).clamp_max(1.0), 0.0)
    if judge is None:
        return drafted
    if judge.features:  # every child of the level in one judgement
        width = children.shape[-1]
        taken = None
        if "log_left" in judge.features:  # each child's earlier siblings' draft mass, in draw order
            q_raw = (raw_probs if raw_probs is not None else logits.float().softmax(-1)).gather(-1, children)
            taken = (q_raw.cumsum(-1) - q_raw).reshape(-1)
        rows = [None if t is None else t.repeat_interleave(width, 0) for t in (states, logits, raw_probs)]
        return judge(rows[0], rows[1], children.reshape(-1), rows[2], taken).view(children.shape).double()
    first = judge(states, logits, children[:, 0], raw_probs).double()[:, None]
    rest = drafted[:, 1:]
    if not do_sample:
        others = rest.sum(-1, keepdim=True)
        rest = torch.where(others > 0, (1.0 - first) * rest / others.clamp_min(1e-300), 0.0)
    return torch.cat([first, rest], -1)


class Oracle(Schedule):
    """`oracle` (greedy, for measurement): each round drafts exactly what the target accepts (`draft_correct`)."""

    name = "oracle"
    greedy_only = knows_target = True

    def __init__(self, draft_correct: list[bool], max_k: int):
        self.draft_correct, self.max_k, self.position = draft_correct, max_k, 0

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        return cls(draft_correct, settings.bound[1])

    def max_draft(self) -> int:
        return len(list(itertools.takewhile(bool, self.draft_correct[self.position:self.position + self.max_k])))

    def end_round(self, num_verified: int, num_accepted: int) -> None:
        self.position += num_accepted + 1


def make_schedule(settings, draft_correct: list[bool] | None = None) -> Schedule:
    """A fresh policy for one generation of `settings` (validated); `oracle` needs `draft_correct`."""
    return SCHEDULES[settings.schedule].from_settings(settings.with_head_defaults(), draft_correct)
