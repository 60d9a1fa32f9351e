"""Choosing a proposer head's stop threshold from the pair's own costs.

Rounds are replayed on training records: `draft[i]` is the draft's proposal after the target's
prefix `x_<i` and `p_acc[i]` the probability that the target accepts it (0/1 in greedy records,
`min(1, p/q)` in sampled ones). A round that starts at position `pos` drafts the proposals from
`pos` on, accepts each in turn with its `p_acc` until the first rejection, and then emits the
target's token, as the engine does; the replay returns the expected counts and cost over those
acceptances. How many tokens a round drafts is decided by the engine's own schedule objects
(`specdecpp.engine.schedules`), driven as the loop drives them with the records' values in place of draft
steps (`schedule_length`), so that each stop rule is written once. Greedy records make it
deterministic: constant K and the oracle replay exactly, and an `ada` round exactly up to its first
rejected token (which tokens are accepted and the number of target calls are exact; only the tokens
a round drafts after its first rejection, judged by the engine from the draft's own wrong prefix and
here from the target's, may differ in number).
Sampled records replay under the assumption training makes too: each acceptance is judged along
the target's prefix. A proposer head's prediction for `draft[i]` comes from that same prefix; a
reader head judges states that have read each proposal, which records hold only for accepted ones,
so only proposer heads are replayed. Each round is priced with the pair's measured times
(`specdecpp.costs.StepTimes`): its draft steps, the head's judgement of each, the target's
verification as a function of its length (on a CPU it grows with the tokens checked) and the loop's
overhead per round, all timed through the engine's own steps. The cost per token is in units of one target-alone step, so 1 / cost is the speedup the
replay predicts. `choose_threshold` replays a grid of thresholds and keeps the cheapest.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator

import numpy as np
import torch
from transformers import PreTrainedModel

from specdecpp.engine.draft_step import DraftStep
from specdecpp.engine.online import OnlineAcceptanceEstimator, log_odds, log_odds_from_log
from specdecpp.engine.schedules import Constant, Dynamic, Judge, Oracle, ProductRule, Schedule, VerifyBudget
from specdecpp.engine.settings import default
from specdecpp.head.model import AcceptancePredictionHead
from specdecpp.costs import StepTimes, cost_per_token, fit_verify_ms, flat_spent, verify_slope
from specdecpp.measuring.step_timing import measure_costs
from specdecpp.head.inputs import predict

THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05 .. 0.95
CONFIDENCES = (0.2, 0.3, 0.4, 0.5, 0.6)  # our dynamic schedule's, replayed beside the head
# How many tokens a round drafts: (the record's predictions, its p_acc, round start, limit) -> k,
# or (verified, drafted) for a round whose verification takes only the first `verified` (`budget_length`).
RoundLength = Callable[[np.ndarray, np.ndarray, int, int], int | tuple[int, int]]
# The most a replayed schedule drafts of itself: `replay`'s `max_draft` and the record's end bound its rounds.
NO_LIMIT = sys.maxsize


def replayed_rounds(accept: list[np.ndarray], values: list[np.ndarray], round_length: RoundLength,
                    max_draft: int) -> Iterator[tuple[int, int, float, int, int]]:
    """Every round a replay takes over records (`accept[r][i]`: the probability that the target
    accepts `draft[i]`, 0 or 1 for greedy records), in order: `(record, start, weight, verified,
    drafted)`, the round at position `start` of record `record` drafting `round_length(values[record],
    accept[record], start, limit)` tokens (at most `max_draft` and never past the record's end: a
    round emits up to `k + 1` tokens) and verifying the first `verified` of them, `weight` the
    probability that a round starts there (for greedy records, 1 on the one path and no round
    elsewhere)."""
    for record, (acc, vals) in enumerate(zip(accept, values)):
        n = len(acc)
        starts = np.zeros(n + 1)  # starts[pos]: P(a round starts at pos)
        starts[0] = 1.0
        for pos in range(n):
            if starts[pos] == 0.0:
                continue
            k = round_length(vals, acc, pos, min(max_draft, n - pos - 1))
            k, drafted = k if isinstance(k, tuple) else (k, k)
            yield record, pos, starts[pos], k, drafted
            reached = starts[pos]  # P(the round's first m proposals are accepted)
            for m in range(k):
                starts[pos + m + 1] += reached * (1.0 - acc[pos + m])
                reached *= acc[pos + m]
            starts[pos + k + 1] += reached


def replay(accept: list[np.ndarray], predictions: list[np.ndarray], round_length: RoundLength, max_draft: int,
           times: StepTimes, judged: bool = False, unit_ms: float | None = None) -> dict:
    """Replay rounds over records (`replayed_rounds`: `accept[r][i]`, the probability that the
    target accepts `draft[i]`, 0 or 1 for greedy records), each drafting `round_length(...)` tokens,
    at most `max_draft` and never past the record's end, every drafted
    token judged by the head when `judged` (a round that verifies fewer than it drafted pays
    every draft step and the verification of those it verifies). Returns the expected counts, time per token
    (`StepTimes.round_ms` per round) and both views of `specdecpp.costs`: `cost_per_token` (measured,
    in `unit_ms`, by default one target-alone step of `times`) and `flat_cost_per_token` (target
    verifications, `c` from `times`), summing over the positions a round can
    start at, weighted by the probability that one does (for greedy records, the one path), and
    `round_weights[k]`, the expected number of rounds that draft and verify `k` tokens (None when
    a round verifies fewer than it drafts), which `StepTimes.rounds_ms` prices at other times."""
    target_calls, draft_calls, total_ms = 0.0, 0.0, 0.0
    round_weights = []
    for _, _, weight, k, drafted in replayed_rounds(accept, predictions, round_length, max_draft):
        target_calls, draft_calls = target_calls + weight, draft_calls + weight * drafted
        total_ms += weight * times.round_ms(drafted, drafted if judged else 0, k)
        if round_weights is not None and k == drafted:
            round_weights.extend([0.0] * (drafted + 1 - len(round_weights)))
            round_weights[drafted] += weight
        else:
            round_weights = None  # rounds that verify fewer than they draft are not priced by length alone
    tokens = sum(len(acc) for acc in accept)
    return {"tokens": tokens, "target_calls": float(target_calls), "draft_calls": float(draft_calls),
            "round_weights": round_weights, "ms_per_token": total_ms / tokens,
            "cost_per_token": cost_per_token(total_ms, tokens, unit_ms or times.target_alone_ms),
            "flat_cost_per_token": cost_per_token(flat_spent(target_calls, draft_calls, times.cost_ratio()), tokens)}


def schedule_length(policy: Schedule, step: Callable[[float, int], DraftStep] | None = None) -> RoundLength:
    """Rounds of the engine's own schedule object `policy`, driven as the loop drives it (`decode`,
    `decoding.draft_round`) with a record's values in place of the draft's forwards: the round
    starts (`start_round`), drafts up to `policy.max_draft()` tokens within the limit, asking
    `stop_after` after each whether to stop, with the draft step `step(value, j)` made of the
    record's value for the `j`-th drafted token (None: a schedule that reads no step and never
    stops early), verifies `verify_length` of them and ends with the outcome (`end_round`: the run
    of accepted proposals, which an online rule learns from; greedy records). Returns the tokens
    drafted, or `(verified, drafted)` when the round verifies fewer."""
    def length(values: np.ndarray, ok: np.ndarray, pos: int, limit: int) -> int | tuple[int, int]:
        policy.start_round()
        most, drafted = min(policy.max_draft(), limit), 0
        while drafted < most:
            drafted += 1
            if step is not None and policy.stop_after(step(values[pos + drafted - 1], drafted)):
                break
        verified = policy.verify_length(drafted)
        policy.end_round(verified, oracle_length(None, ok, pos, verified))
        return drafted if verified == drafted else (verified, drafted)
    return length


def judged_step(value: float, num_drafted: int) -> DraftStep:
    """The `num_drafted`-th draft step carrying a record's value as its `accept_prob` (the head's
    recorded prediction, or the feature an estimator judges from), as a compiled step hands it."""
    return DraftStep(num_drafted, 1.0, accept_prob=float(value))


def ada_length(threshold: float, min_draft: int, scale: list[float] | None = None) -> RoundLength:
    """The `ada` rule for a proposer head on its recorded predictions; with `scale` (`marginal_scale`)
    the cost-aware rule (`CostAwareRule`)."""
    rule = CostAwareRule(threshold, min_draft, scale) if scale else ProductRule(Judge(), threshold, (min_draft, NO_LIMIT))
    return schedule_length(rule, judged_step)


class CostAwareRule(ProductRule):
    """The cost-aware stop rule (replayed, not run by the engine): the product rule at threshold
    `1 - (1 - threshold) * scale[j - 1]` after `j` drafted tokens, at most `len(scale)` a round."""

    def __init__(self, stop_threshold: float, min_draft: int, scale: list[float]):
        super().__init__(Judge(), stop_threshold, (min_draft, len(scale)))
        self.thresholds = [1.0 - (1.0 - stop_threshold) * factor for factor in scale]

    def threshold(self, num_drafted: int) -> float:
        return self.thresholds[num_drafted - 1]


def marginal_scale(times: StepTimes, max_draft: int) -> list[float]:
    """The cost-aware stop rule's factors: `scale[j - 1]` is what one more token costs after `j`
    drafted ones (the next draft step, its judgement, and the verification's growth per token,
    `verify_slope`, so that timing noise cannot make it negative) over what it costs
    after the first. Drafting one more token gains `prod p_hat * p_next` expected tokens for that
    cost, so continuing while `prod p_hat >= (1 - threshold) * scale[j - 1]` is the rule "draft
    on while the expected gain pays for the marginal cost", with `1 - threshold` standing for the
    cost of the first extra token over a token's value. Flat step times give all ones: the product
    threshold."""
    slope = verify_slope(times.verify_ms)
    draft = list(times.draft_ms) or [0.0]
    marginal = [draft[min(j, len(draft) - 1)] + times.judge_ms + slope for j in range(1, max_draft + 1)]
    return [m / marginal[0] if marginal[0] > 0 else 1.0 for m in marginal]


def online_length(estimator: OnlineAcceptanceEstimator, threshold: float, min_draft: int) -> RoundLength:
    """The product rule on `estimator`'s predictions from the record's features (the values
    replayed: `greedy_log_odds` for `online`, the head's logits for `ada` recalibrated online), as
    `Online` and `Ada` with `online=True` judge, the estimator learning each
    round's outcome. Greedy records only, replayed in order: their one path is the sequence it learns from."""
    return schedule_length(ProductRule(Judge(estimator), threshold, (min_draft, NO_LIMIT)), judged_step)


def budget_length(max_draft: int, times: StepTimes, judged: bool = False,
                  estimator: OnlineAcceptanceEstimator | None = None) -> RoundLength:
    """vLLM's adaptive verification at batch 1, the engine's `VerifyBudget`: draft `max_draft`
    tokens (fewer near the record's end), score each by its survival (the running product of the
    predictions: the values replayed, or with an `estimator` its predictions from them as features,
    after which it learns the verified tokens' outcome) and verify the prefix that maximises the
    expected tokens per round time, each length priced with `times` (the whole block's draft steps,
    its judgements when `judged`, the verification of the prefix). Returns `(verified, drafted)`
    when it verifies fewer than it drafted."""
    return schedule_length(VerifyBudget(Judge(estimator), max_draft, times, judged), judged_step)


def greedy_log_odds(record: dict) -> np.ndarray:
    """vLLM's feature, `logit(max q)`, at every position of a greedy record: its proposal is the
    draft's top token, so `log_p_draft` is `log max q`."""
    return np.array([log_odds_from_log(x) for x in record["log_p_draft"]])


def dynamic_length(confidence: float) -> RoundLength:
    """Our `dynamic` rule (the engine's `Dynamic`), replayed with the draft's probability of each
    proposal as the draft step's: stop after drafting a token whose probability is below `confidence`."""
    return schedule_length(Dynamic(NO_LIMIT, confidence), lambda prob, num_drafted: DraftStep(num_drafted, prob))


def constant_length(k: int) -> RoundLength:
    """Draft exactly `k` tokens (the engine's `Constant`)."""
    return schedule_length(Constant(k))


def oracle_length(pred: np.ndarray | None, ok: np.ndarray, pos: int, limit: int) -> int:
    """Draft exactly the run of proposals the target will accept (greedy records only): the engine's
    `Oracle` over the record's correct proposals from `pos`."""
    return Oracle(ok[pos:pos + limit], limit).max_draft()


def choose_threshold(head: AcceptancePredictionHead, draft: PreTrainedModel, target: PreTrainedModel,
                     records: list[dict], bound: tuple[int, int] = default("bound"), thresholds: tuple[float, ...] = THRESHOLDS,
                     batch_size: int = 8, timing_repeats: int = 16,
                     predictions: np.ndarray | None = None,
                     times: tuple[StepTimes, StepTimes] | None = None, compile: bool = False) -> tuple[float, dict]:
    """The threshold in `thresholds` whose replayed cost per token on `records` (greedy or sampled,
    as the head will decode) is lowest, and the record of the choice (measured times, the cost
    curve, constant K = 1..6, our `dynamic` at `CONFIDENCES` (from the draft's probability of each
    proposal, `log_p_draft`), for greedy records the oracle and the online rules (`online_costs`:
    vLLM's estimator at each threshold, the head recalibrated online, adaptive verification)
    replayed alike, and the logits
    processing the records were built under, `records_processing`), ready to store with
    `head.with_threshold`. `predictions`: the head's predictions over the records
    (`inputs.predict`) when the caller already has them; `times`: the step times `(plain,
    judged)` to price rounds with (`head.folder.stored_step_times`), instead of timing the pair now on the
    engine decoding will run (compiled when `compile`; the times record which). ValueError when
    the replay shows the times to be wrong (`check_replayed_costs`)."""
    if head.alignment != "proposer":
        raise ValueError("choosing a threshold replays rounds from the head's predictions, which needs a "
                         "proposer head (a reader head judges states the records do not hold)")
    processing = records_processing(records)  # records of mixed processing are refused before any work
    flat = predict(head, draft, records, batch_size=batch_size)[1] if predictions is None else predictions
    bounds = np.cumsum([0] + [len(r["p_acc"]) for r in records])
    predictions = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    accept = [np.asarray(r["p_acc"], dtype=np.float64) for r in records]
    greedy = all(np.isin(a, (0.0, 1.0)).all() for a in accept)
    plain, judged = times or measure_costs(target, draft, probe_input(records), bound[1], head=head,
                                           do_sample=not greedy, repeats=timing_repeats, compile=compile)

    draft_probs = [np.exp(np.asarray(r["log_p_draft"], dtype=np.float64)) for r in records]

    calls = {}  # method -> [target calls, draft calls] per token: the counts behind every cost
    round_weights = {}  # method -> its rounds counted by length (`replay`)

    def cost(method: str, round_length: RoundLength, times: StepTimes = plain,
             values: list[np.ndarray] = predictions) -> float:
        replayed = replay(accept, values, round_length, bound[1], times, times is judged, plain.target_alone_ms)
        calls[method] = [round(replayed[f"{kind}_calls"] / replayed["tokens"], 5) for kind in ("target", "draft")]
        round_weights[method] = replayed["round_weights"]
        return round(replayed["cost_per_token"], 5)

    curve = [cost(f"ada@{t:g}", ada_length(t, bound[0]), judged) for t in thresholds]
    scale = [round(f, 4) for f in marginal_scale(judged, bound[1])]
    marginal_curve = [cost(f"ada-marginal@{t:g}", ada_length(t, bound[0], scale), judged) for t in thresholds]
    selection = {"records": len(records), "tokens": int(bounds[-1]), "bound": list(bound),
                 "mode": "greedy" if greedy else "sampling", "processing": processing,
                 "step_times": plain.as_dict(), "judged_step_times": judged.as_dict(),
                 "thresholds": list(thresholds), "cost_per_token": curve,
                 "round_weights": [round_weights[f"ada@{t:g}"] for t in thresholds],
                 "marginal_scale": scale, "marginal_cost_per_token": marginal_curve,
                 "constant_k_cost_per_token": {str(k): cost(f"K={k}", constant_length(k)) for k in range(1, 7)},
                 "dynamic_cost_per_token": {f"{c:g}": cost(f"dynamic@{c:g}", dynamic_length(c), values=draft_probs)
                                            for c in CONFIDENCES},
                 "oracle_cost_per_token": cost("oracle", oracle_length) if greedy else None,
                 **(online_costs(records, predictions, cost, thresholds, bound, plain, judged) if greedy
                    else dict.fromkeys(ONLINE_KEYS)),
                 "cost_unit": "one target-alone step through the loop (1 / cost = replayed speedup)"}
    selection["calls_per_token"] = calls
    check_replayed_costs(selection, plain)
    return thresholds[int(np.argmin(curve))], selection


ONLINE_KEYS = ("online_cost_per_token", "ada_online_cost_per_token", "verify_budget_cost_per_token",
               "ada_budget_cost_per_token")
BUDGET_KS = tuple(range(1, 7))  # the blocks verify-budget and ada-budget draft, as constant K's


def online_costs(records: list[dict], predictions: list[np.ndarray], cost: Callable, thresholds: tuple[float, ...],
                 bound: tuple[int, int], plain: StepTimes, judged: StepTimes) -> dict:
    """The online rules replayed on greedy records, in order (each from its cold start, learning
    over all of them; `cost(method, round_length, times, values)` replays one): vLLM's estimator
    under the product rule at each threshold (`online`), the head recalibrated online at each
    threshold (`ada` with `online=True`), and adaptive verification of blocks of `BUDGET_KS`
    tokens with the online estimator's survival scores (`verify-budget`) and with the head's
    (`ada-budget`), priced with these step times."""
    features = [greedy_log_odds(r) for r in records]
    head_logits = [np.array([log_odds(float(p)) for p in values]) for values in predictions]
    return {
        "online_cost_per_token": {f"{t:g}": cost(f"online@{t:g}", online_length(
            OnlineAcceptanceEstimator(bound[1]), t, bound[0]), plain, features) for t in thresholds},
        "ada_online_cost_per_token": [
            cost(f"ada-online@{t:g}", online_length(OnlineAcceptanceEstimator.recalibration(bound[1]), t, bound[0]),
                 judged, head_logits)
            for t in thresholds],
        "verify_budget_cost_per_token": {str(k): cost(f"verify-budget@K={k}", budget_length(
            k, plain, estimator=OnlineAcceptanceEstimator(bound[1])), plain, features) for k in BUDGET_KS},
        "ada_budget_cost_per_token": {str(k): cost(f"ada-budget@K={k}", budget_length(k, judged, judged=True), judged)
                                      for k in BUDGET_KS},
    }


def records_processing(records: list[dict]) -> dict:
    """The logits processing the records were built under (their `processing`; none when absent),
    as `DecodingSettings.processing_fields()` names it: what `auto` compares a generation's with. Records
    built under different processing are a ValueError: acceptance, hence the threshold, depends on it."""
    found = {json.dumps(r.get("processing", {}), sort_keys=True) for r in records}
    if len(found) > 1:
        raise ValueError(f"the records were built under different logits processing ({', '.join(sorted(found))}): "
                         "choose a threshold on records built under the processing decoding will use")
    return json.loads(found.pop())


def check_replayed_costs(selection: dict, times: StepTimes) -> None:
    """Refuse (ValueError) a replay that only wrong step times can give, rather than choose a
    threshold from it: a constant K that would cost more than the target alone even if every
    drafted token were accepted and drafting were free (one verification of `K + 1` tokens timed
    longer than `K + 1` target-alone steps, which read the same weights `K + 1` times), or, for
    greedy records, the oracle costing more than a causal rule. The oracle drafts exactly the
    tokens that will be accepted, and no rule that must guess can beat it while one more drafted
    token (its draft step and the verification's growth) costs less than a verification's fixed
    part; that holds for any pair worth speculating with, and the oracle is checked only then
    (the causal rules: constant K, `dynamic`, `ada` and, when replayed, `online`)."""
    way_out = ("time the steps again on a quieter machine, or pass --step_times_from a head folder whose step "
               "times are sound")
    for k in map(int, selection["constant_k_cost_per_token"]):
        verify_ms = times.verify_ms[min(k, len(times.verify_ms) - 1)]
        if verify_ms > (k + 1) * times.target_alone_ms:
            raise ValueError(f"the step times price a verification of K={k} drafted tokens at {verify_ms:.2f} ms, more "
                             f"than {k + 1} target-alone steps of {times.target_alone_ms:.2f} ms, so constant K={k} "
                             f"would cost {verify_ms / (k + 1) / times.target_alone_ms:.3f} target-alone steps per "
                             f"token with every token accepted and free drafting (replayed: "
                             f"{selection['constant_k_cost_per_token'][str(k)]:.3f}): a measurement error; {way_out}")
    oracle = selection["oracle_cost_per_token"]
    causal = {f"K={k}": cost for k, cost in selection["constant_k_cost_per_token"].items()} \
        | {f"dynamic@{c}": cost for c, cost in selection["dynamic_cost_per_token"].items()} \
        | {f"ada@{t:g}": cost for t, cost in zip(selection["thresholds"], selection["cost_per_token"])} \
        | {f"online@{t}": cost for t, cost in (selection.get("online_cost_per_token") or {}).items()}
    cheapest = min(causal, key=causal.get)
    slope = verify_slope(times.verify_ms)
    unbeatable = max(times.draft_ms, default=0.0) + slope \
        <= fit_verify_ms(times.verify_ms)[0] - slope + times.round_overhead_ms
    if oracle is not None and unbeatable and oracle > causal[cheapest]:
        raise ValueError(f"the replayed oracle costs {oracle:.3f} target-alone steps per token, more than {cheapest} "
                         f"({causal[cheapest]:.3f}), which must guess which tokens are accepted: the step times are "
                         "wrong (verifications of 0, 1, ... drafted tokens priced at "
                         + " ".join(f"{v:.2f}" for v in times.verify_ms) + f" ms); {way_out}")


def probe_input(records: list[dict]) -> torch.LongTensor:
    """Where to time the steps: the record whose prompt is nearest the mean length, its prompt and
    the first half of its continuation, the context a generation sees halfway through."""
    mean_length = sum(len(r["prefix"]) for r in records) / len(records)
    record = min(records, key=lambda r: abs(len(r["prefix"]) - mean_length))
    return torch.tensor([list(record["prefix"]) + list(record["tokens"][: len(record["tokens"]) // 2])])
