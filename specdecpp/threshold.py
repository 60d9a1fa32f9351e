"""Choosing a proposer head's stop threshold from the pair's own costs.

Rounds are replayed on training records: `draft[i]` is the draft's proposal after the target's
prefix `x_<i` and `p_acc[i]` the probability that the target accepts it (0/1 in greedy records,
`min(1, p/q)` in sampled ones). A round that starts at position `pos` drafts the proposals from
`pos` on, accepts each in turn with its `p_acc` until the first rejection, and then emits the
target's token, as the engine does; the replay returns the expected counts and cost over those
acceptances. Greedy records make it deterministic: constant K and the oracle replay exactly, and an
`ada` round exactly up to its first rejected token (which tokens are accepted and the number of
target calls are exact; only the tokens a round drafts after its first rejection, judged by the
engine from the draft's own wrong prefix and here from the target's, may differ in number).
Sampled records replay under the assumption training makes too: each acceptance is judged along
the target's prefix. A proposer head's prediction for `draft[i]` comes from that same prefix; a
reader head judges states that have read each proposal, which records hold only for accepted ones,
so only proposer heads are replayed. Each round is priced with the pair's measured times: one draft
step, and one target verification as a function of its length (on a CPU it grows with the tokens
checked). The cost per token is in units of one target-alone step, so 1 / cost is the speedup the
replay predicts. `choose_threshold` replays a grid of thresholds and keeps the cheapest.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np
import torch
from transformers import PreTrainedModel

from specdecpp.head import AcceptancePredictionHead
from specdecpp.head_data import predict
from specdecpp.metrics import cached_step, cached_steps, time_alternately

THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05 .. 0.95
# How many tokens a round drafts: (the record's predictions, its p_acc, round start, limit) -> k.
RoundLength = Callable[[np.ndarray, np.ndarray, int, int], int]


def step_times(target: PreTrainedModel, draft: PreTrainedModel, input_ids: torch.LongTensor, max_draft: int,
               steps: int = 20, warmup_steps: int = 5) -> dict:
    """Median times (ms) on warm KV caches of `input_ids` `[1, length]`: one draft step, and one
    target verification of `k` drafted tokens (`k + 1` fed) for every `k` in `0..max_draft`
    (`k = 0` is a target-alone step), timed alternately (`metrics.time_alternately`) on one
    cache per model."""
    draft_step = cached_step(draft, input_ids, 1)
    verifies = cached_steps(target, input_ids, [k + 1 for k in range(max_draft + 1)])
    time_alternately(draft_step, verifies, warmup_steps)
    draft_ms, verify_ms = time_alternately(draft_step, verifies, steps)
    return {"draft_step_ms": statistics.median(draft_ms), "verify_ms": [statistics.median(t) for t in verify_ms],
            "steps": steps, "threads": torch.get_num_threads(), "device": str(target.device)}


def replay(accept: list[np.ndarray], predictions: list[np.ndarray], round_length: RoundLength, max_draft: int,
           times: dict) -> dict:
    """Replay rounds over records (`accept[r][i]`: the probability that the target accepts
    `draft[i]`, 0 or 1 for greedy records), each drafting `round_length(...)` tokens, at most
    `max_draft` and never past the record's end (a round emits up to `k + 1` tokens). Returns the
    expected counts and cost per token in target-alone steps, summing over the positions a round
    can start at, weighted by the probability that one does (for greedy records, the one path)."""
    draft_ms, verify_ms = times["draft_step_ms"], times["verify_ms"]
    tokens, target_calls, draft_calls, total_ms = 0, 0.0, 0.0, 0.0
    for acc, pred in zip(accept, predictions):
        n = len(acc)
        starts = np.zeros(n + 1)  # starts[pos]: P(a round starts at pos)
        starts[0] = 1.0
        for pos in range(n):
            if starts[pos] == 0.0:
                continue
            k = round_length(pred, acc, pos, min(max_draft, n - pos - 1))
            target_calls, draft_calls = target_calls + starts[pos], draft_calls + starts[pos] * k
            total_ms += starts[pos] * (verify_ms[k] + draft_ms * k)
            reached = starts[pos]  # P(the round's first m proposals are accepted)
            for m in range(k):
                starts[pos + m + 1] += reached * (1.0 - acc[pos + m])
                reached *= acc[pos + m]
            starts[pos + k + 1] += reached
        tokens += n
    return {"tokens": tokens, "target_calls": float(target_calls), "draft_calls": float(draft_calls),
            "cost_per_token": total_ms / tokens / verify_ms[0]}


def ada_length(threshold: float, min_draft: int) -> RoundLength:
    """The `ada` rule for a proposer head: after drafting `y_j` (record position `pos + j - 1`),
    stop once `1 - prod p_hat > threshold` and `j >= min_draft`."""
    def length(pred: np.ndarray, ok: np.ndarray, pos: int, limit: int) -> int:
        p_all_accepted, j = 1.0, 0
        while j < limit:
            p_all_accepted *= pred[pos + j]
            j += 1
            if j >= min_draft and 1.0 - p_all_accepted > threshold:
                break
        return j
    return length


def constant_length(k: int) -> RoundLength:
    """Draft exactly `k` tokens."""
    return lambda pred, ok, pos, limit: min(k, limit)


def oracle_length(pred: np.ndarray, ok: np.ndarray, pos: int, limit: int) -> int:
    """Draft exactly the run of proposals the target will accept (greedy records only)."""
    run = 0
    while run < limit and ok[pos + run]:
        run += 1
    return run


def choose_threshold(head: AcceptancePredictionHead, draft: PreTrainedModel, target: PreTrainedModel,
                     records: list[dict], bound: tuple[int, int] = (2, 20), thresholds: tuple[float, ...] = THRESHOLDS,
                     batch_size: int = 8, timing_steps: int = 20,
                     predictions: np.ndarray | None = None) -> tuple[float, dict]:
    """The threshold in `thresholds` whose replayed cost per token on `records` (greedy or sampled,
    as the head will decode) is lowest, and the record of the choice (measured times, the cost
    curve, constant K = 1..6 and, for greedy records, the oracle replayed alike), ready to store
    with `head.with_threshold`. `predictions`: the head's predictions over the records
    (`head_data.predict`) when the caller already has them."""
    if head.alignment != "proposer":
        raise ValueError("choosing a threshold replays rounds from the head's predictions, which needs a "
                         "proposer head (a reader head judges states the records do not hold)")
    flat = predict(head, draft, records, batch_size=batch_size)[1] if predictions is None else predictions
    bounds = np.cumsum([0] + [len(r["p_acc"]) for r in records])
    predictions = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    accept = [np.asarray(r["p_acc"], dtype=np.float64) for r in records]
    greedy = all(np.isin(a, (0.0, 1.0)).all() for a in accept)
    longest = max(records, key=lambda r: len(r["prefix"]))
    times = step_times(target, draft, torch.tensor([longest["prefix"]]), bound[1], timing_steps)
    def cost(round_length: RoundLength) -> float:
        return round(replay(accept, predictions, round_length, bound[1], times)["cost_per_token"], 5)

    curve = [cost(ada_length(t, bound[0])) for t in thresholds]
    selection = {"records": len(records), "tokens": int(bounds[-1]), "bound": list(bound),
                 "mode": "greedy" if greedy else "sampling", **times,
                 "thresholds": list(thresholds), "cost_per_token": curve,
                 "constant_k_cost_per_token": {str(k): cost(constant_length(k)) for k in range(1, 7)},
                 "oracle_cost_per_token": cost(oracle_length) if greedy else None,
                 "cost_unit": "one target-alone step (1 / cost = replayed speedup)"}
    return thresholds[int(np.argmin(curve))], selection
