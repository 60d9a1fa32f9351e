"""Choosing a proposer head's stop threshold: the engine's schedules replayed on records, priced by `StepTimes`."""
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
# How many tokens a round drafts: (the record's predictions, its p_acc, round start, limit) -> k or (verified, drafted)
RoundLength = Callable[[np.ndarray, np.ndarray, int, int], int | tuple[int, int]]
NO_LIMIT = sys.maxsize


def replayed_rounds(accept: list[np.ndarray], values: list[np.ndarray], round_length: RoundLength,
                    max_draft: int) -> Iterator[tuple[int, int, float, int, int]]:
    """Every round a replay takes over records, in order, as `(record, start, weight, verified, drafted)`."""
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
    """The expected calls, time per token and cost views of replayed rounds, with `round_weights` (by length)."""
    target_calls, draft_calls, total_ms, round_weights = 0.0, 0.0, 0.0, []
    for _, _, weight, k, drafted in replayed_rounds(accept, predictions, round_length, max_draft):
        target_calls, draft_calls = target_calls + weight, draft_calls + weight * drafted
        total_ms += weight * times.round_ms(drafted, drafted if judged else 0, k)
        if round_weights is not None and k == drafted:
            round_weights.extend([0.0] * (drafted + 1 - len(round_weights)))
            round_weights[drafted] += weight
        else:
            round_weights = None
    tokens = sum(len(acc) for acc in accept)
    return {"tokens": tokens, "target_calls": float(target_calls), "draft_calls": float(draft_calls),
            "round_weights": round_weights, "ms_per_token": total_ms / tokens,
            "cost_per_token": cost_per_token(total_ms, tokens, unit_ms or times.target_alone_ms),
            "flat_cost_per_token": cost_per_token(flat_spent(target_calls, draft_calls, times.cost_ratio()), tokens)}


def schedule_length(policy: Schedule, step: Callable[[float, int], DraftStep] | None = None) -> RoundLength:
    """Rounds of the engine's schedule `policy`, driven as the loop drives it with `step(value, j)` as draft steps."""
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
    """The `num_drafted`-th draft step carrying a record's value as its `accept_prob`."""
    return DraftStep(num_drafted, 1.0, accept_prob=float(value))


def ada_length(threshold: float, min_draft: int, scale: list[float] | None = None) -> RoundLength:
    """The `ada` rule on a proposer head's recorded predictions; with `scale`, the cost-aware rule."""
    rule = CostAwareRule(threshold, min_draft, scale) if scale else ProductRule(Judge(), threshold, (min_draft, NO_LIMIT))
    return schedule_length(rule, judged_step)


class CostAwareRule(ProductRule):
    """The product rule at threshold `1 - (1 - threshold) * scale[j - 1]` after `j` drafted tokens (replayed only)."""

    def __init__(self, stop_threshold: float, min_draft: int, scale: list[float]):
        super().__init__(Judge(), stop_threshold, (min_draft, len(scale)))
        self.thresholds = [1.0 - (1.0 - stop_threshold) * factor for factor in scale]

    def threshold(self, num_drafted: int) -> float:
        return self.thresholds[num_drafted - 1]


def marginal_scale(times: StepTimes, max_draft: int) -> list[float]:
    """The cost-aware rule's factors: `scale[j - 1]` is the cost of one more token after `j` over that after one."""
    slope, draft = verify_slope(times.verify_ms), list(times.draft_ms) or [0.0]
    marginal = [draft[min(j, len(draft) - 1)] + times.judge_ms + slope for j in range(1, max_draft + 1)]
    return [m / marginal[0] if marginal[0] > 0 else 1.0 for m in marginal]


def online_length(estimator: OnlineAcceptanceEstimator, threshold: float, min_draft: int) -> RoundLength:
    """The product rule on `estimator`'s predictions from the record's features (greedy records, in order)."""
    return schedule_length(ProductRule(Judge(estimator), threshold, (min_draft, NO_LIMIT)), judged_step)


def budget_length(max_draft: int, times: StepTimes, judged: bool = False,
                  estimator: OnlineAcceptanceEstimator | None = None) -> RoundLength:
    """vLLM's adaptive verification at batch 1 (`VerifyBudget`) with blocks of `max_draft` tokens."""
    return schedule_length(VerifyBudget(Judge(estimator), max_draft, times, judged), judged_step)


def greedy_log_odds(record: dict) -> np.ndarray:
    """vLLM's feature, `logit(max q)`, at every position of a greedy record."""
    return np.array([log_odds_from_log(x) for x in record["log_p_draft"]])


def dynamic_length(confidence: float) -> RoundLength:
    """Our `dynamic` rule (the engine's `Dynamic`) on the draft's probability of each proposal."""
    return schedule_length(Dynamic(NO_LIMIT, confidence), lambda prob, num_drafted: DraftStep(num_drafted, prob))


def constant_length(k: int) -> RoundLength:
    return schedule_length(Constant(k))


def oracle_length(pred: np.ndarray | None, ok: np.ndarray, pos: int, limit: int) -> int:
    """The engine's `Oracle` over a greedy record's correct proposals from `pos`."""
    return Oracle(ok[pos:pos + limit], limit).max_draft()


def choose_threshold(head: AcceptancePredictionHead, draft: PreTrainedModel, target: PreTrainedModel,
                     records: list[dict], bound: tuple[int, int] = default("bound"),
                     thresholds: tuple[float, ...] = THRESHOLDS, batch_size: int = 8, timing_repeats: int = 16,
                     predictions: np.ndarray | None = None, times: tuple[StepTimes, StepTimes] | None = None,
                     compile: bool = False) -> tuple[float, dict]:
    """The threshold in `thresholds` whose replayed cost per token on `records` is lowest, and the record of the
    choice for `head.with_threshold`; ValueError when the replay shows the times to be wrong."""
    if head.alignment != "proposer":
        raise ValueError("choosing a threshold replays rounds from the head's predictions, which needs a "
                         "proposer head (a reader head judges states the records do not hold)")
    processing = records_processing(records)  # refuses mixed processing before any work
    flat = predict(head, draft, records, batch_size=batch_size)[1] if predictions is None else predictions
    bounds = np.cumsum([0] + [len(r["p_acc"]) for r in records])
    predictions = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    accept = [np.asarray(r["p_acc"], dtype=np.float64) for r in records]
    greedy = all(np.isin(a, (0.0, 1.0)).all() for a in accept)
    plain, judged = times or measure_costs(target, draft, probe_input(records), bound[1], head=head,
                                           do_sample=not greedy, repeats=timing_repeats, compile=compile)
    draft_probs = [np.exp(np.asarray(r["log_p_draft"], dtype=np.float64)) for r in records]
    calls, round_weights = {}, {}  # by method: [target calls, draft calls] per token; its rounds' weights
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
BUDGET_KS = tuple(range(1, 7))


def online_costs(records: list[dict], predictions: list[np.ndarray], cost: Callable, thresholds: tuple[float, ...],
                 bound: tuple[int, int], plain: StepTimes, judged: StepTimes) -> dict:
    """The online rules replayed on greedy records in order from a cold start, per threshold or block K."""
    features = [greedy_log_odds(r) for r in records]
    head_logits = [np.array([log_odds(float(p)) for p in values]) for values in predictions]
    return {
        "online_cost_per_token": {f"{t:g}": cost(f"online@{t:g}", online_length(
            OnlineAcceptanceEstimator(bound[1]), t, bound[0]), plain, features) for t in thresholds},
        "ada_online_cost_per_token": [cost(f"ada-online@{t:g}", online_length(OnlineAcceptanceEstimator.recalibration(
            bound[1]), t, bound[0]), judged, head_logits) for t in thresholds],
        "verify_budget_cost_per_token": {str(k): cost(f"verify-budget@K={k}", budget_length(
            k, plain, estimator=OnlineAcceptanceEstimator(bound[1])), plain, features) for k in BUDGET_KS},
        "ada_budget_cost_per_token": {str(k): cost(f"ada-budget@K={k}", budget_length(k, judged, judged=True), judged)
                                      for k in BUDGET_KS},
    }


def records_processing(records: list[dict]) -> dict:
    """The logits processing the records were built under; ValueError when they differ."""
    found = {json.dumps(r.get("processing", {}), sort_keys=True) for r in records}
    if len(found) > 1:
        raise ValueError(f"the records were built under different logits processing ({', '.join(sorted(found))}): "
                         "choose a threshold on records built under the processing decoding will use")
    return json.loads(found.pop())


def check_replayed_costs(selection: dict, times: StepTimes) -> None:
    """ValueError for a replay only wrong step times can give (a K dearer than the target alone, a losing oracle)."""
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
    """Where to time the steps: the prompt nearest the mean length and half its continuation."""
    mean_length = sum(len(r["prefix"]) for r in records) / len(records)
    record = min(records, key=lambda r: abs(len(r["prefix"]) - mean_length))
    return torch.tensor([list(record["prefix"]) + list(record["tokens"][: len(record["tokens"]) // 2])])
