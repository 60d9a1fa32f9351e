"""The head against vLLM's online acceptance estimator, replayed exactly on greedy records.

Rounds are replayed (`specdecpp.calibration.threshold.replay`) on greedy records built with the pair (`build_data`),
one record per prompt, in prompt order. Greedy records make the replay exact in target calls (the
accepted tokens) and in what the online estimators learn; only the tokens a round drafts after its
first rejection are judged from the target's prefix instead of the draft's (docs/design.md,
Choosing the threshold). Every rule that learns online (`online`, `verify-budget`, `ada --online`)
learns over the prompts in order from its cold start, as one estimator serving a run's prompts would.
Costs are in the flat view (`specdecpp.costs`, target verifications per token, a draft step `c` =
`--cost_ratio`); the measured view prices rounds with the head's stored step
times (`verify-budget` and `ada-budget` choose their verified prefix with those times).

Compared, each at its best setting on all the prompts (grids as the threshold replay's):
- `ada@auto` (the head at its stored threshold) and `ada` at its best threshold;
- `ada --online`: the head recalibrated online, at `auto` and at its best threshold;
- `online`: vLLM 0.32's estimator under our product rule, at its best threshold;
- `online (offline fit)`: the estimator's form fitted to convergence on every observation the
  online run at its best threshold labelled, then frozen: the form's ceiling on this data;
- `verify-budget` (vLLM's adaptive verification, online survival scores) and `ada-budget` (the
  same rule on the head's predictions), at their best block K;
- constant K, our `dynamic` and the oracle.

Each method's learning curve is its cost over the first 10 and 50 prompts and over all of them.

    python benchmarks/online_estimators.py --records data/generated/humaneval-greedy.jsonl \\
        --output outputs/online-estimators/humaneval
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from harness import DRAFT, HEAD, load_pair

from specdecpp.calibration.report import calibration_report
from specdecpp.calibration.threshold import (CONFIDENCES, THRESHOLDS, RoundLength, ada_length, budget_length,
                                             constant_length, dynamic_length, greedy_log_odds, online_length,
                                             oracle_length, replay)
from specdecpp.costs import StepTimes, cost_per_token, flat_spent
from specdecpp.data.io import read_records
from specdecpp.engine.online import L2, OnlineAcceptanceEstimator, log_odds
from specdecpp.head.folder import stored_step_times
from specdecpp.head.inputs import predict

BLOCKS = tuple(range(1, 9))  # K for constant, verify-budget and ada-budget
CURVE = (10, 50)  # the learning curve's first prompts (and all)


def fit_offline(observations: list[tuple[int, float, float]], num_positions: int, iterations: int = 50,
                ridge: float = L2) -> OnlineAcceptanceEstimator:
    """The estimator's form fitted to convergence on all `observations` `(position, feature, label)`, frozen."""
    estimator = OnlineAcceptanceEstimator(num_positions, refit_interval=1, damping=0.0, ridge=ridge)
    for _ in range(iterations):
        before = (estimator.slope, list(estimator.intercepts))
        for position, feature, label in observations:
            estimator._add(position, feature, estimator.predict(position, feature), label)
        estimator.refit()
        if max(abs(estimator.slope - before[0]),
               max(abs(x - y) for x, y in zip(estimator.intercepts, before[1]))) < 1e-10:
            break
    return estimator.frozen()


class Replayed:
    """One method's rounds over the records in order: per record its tokens, target calls, draft
    calls and time (ms, priced with the step times)."""

    def __init__(self, accept: list[np.ndarray], values: list[np.ndarray], rule: RoundLength, max_draft: int,
                 times: StepTimes, judged: bool):
        self.per_record = []
        for acc, value in zip(accept, values):  # in order: a learning rule carries its state on
            out = replay([acc], [value], rule, max_draft, times, judged)
            self.per_record.append((out["tokens"], out["target_calls"], out["draft_calls"],
                                    out["ms_per_token"] * out["tokens"]))

    def flat(self, cost_ratio: float, first: int | None = None) -> float:
        """Flat cost per token over the first `first` records (all when None)."""
        tokens, target, draft, _ = np.sum(self.per_record[:first], axis=0)
        return cost_per_token(flat_spent(target, draft, cost_ratio), tokens)

    def summary(self, cost_ratio: float, unit_ms: float) -> dict:
        tokens, target, draft, ms = np.sum(self.per_record, axis=0)
        return {"flat_cost_per_token": self.flat(cost_ratio),
                "curve": {str(n): self.flat(cost_ratio, n) for n in CURVE if n < len(self.per_record)},
                "target_calls_per_token": target / tokens, "draft_calls_per_token": draft / tokens,
                "measured_cost_per_token": cost_per_token(ms, tokens, unit_ms)}


def study(records: list[dict], predictions: list[np.ndarray], head_threshold: float, bound: tuple[int, int],
          plain: StepTimes, judged: StepTimes, cost_ratio: float, logit_shift: float = 0.0) -> list[dict]:
    """Every method of the module docstring on `records` (greedy, in prompt order), the head's
    `predictions` over them; returns one row per method at its best setting. With a
    `logit_shift`, also `ada@auto` and `ada --online` with the head's logit raised by it (a head
    that much too confident: how much of a miscalibration the online recalibration undoes)."""
    accept = [np.asarray(r["p_acc"], dtype=np.float64) for r in records]
    if not all(np.isin(a, (0.0, 1.0)).all() for a in accept):
        raise ValueError("the online estimators are replayed exactly on greedy records only")
    features = [greedy_log_odds(r) for r in records]
    head_logits = [np.array([log_odds(float(p)) for p in values]) for values in predictions]
    draft_probs = [np.exp(np.asarray(r["log_p_draft"], dtype=np.float64)) for r in records]
    rows = []

    def run(values, rule, times, is_judged=False) -> Replayed:
        return Replayed(accept, values, rule, bound[1], times, is_judged)

    def best(method: str, grid, make, note: str = "") -> Replayed:
        """The grid value whose replay (`make(value)`) costs least; adds its row."""
        runs = {value: make(value) for value in grid}
        value = min(runs, key=lambda v: runs[v].flat(cost_ratio))
        add(method, value, runs[value], note, {str(v): r.flat(cost_ratio) for v, r in runs.items()})
        return runs[value]

    def add(method: str, setting, replayed: Replayed, note: str = "", grid: dict | None = None) -> None:
        rows.append({"method": method, "setting": setting, "note": note, "grid": grid,
                     **replayed.summary(cost_ratio, plain.target_alone_ms)})

    def online(threshold: float, estimator: OnlineAcceptanceEstimator) -> Replayed:
        return run(features, online_length(estimator, threshold, bound[0]), plain)

    def recalibrated(threshold: float, logits: list[np.ndarray] = head_logits,
                     estimator: OnlineAcceptanceEstimator | None = None) -> Replayed:
        return run(logits, online_length(estimator or OnlineAcceptanceEstimator.recalibration(bound[1]), threshold,
                                         bound[0]), judged, True)

    add("ada@auto", head_threshold, run(predictions, ada_length(head_threshold, bound[0]), judged, True),
        "the head at its stored threshold")
    best("ada, best threshold", THRESHOLDS, lambda t: run(predictions, ada_length(t, bound[0]), judged, True))
    learned = OnlineAcceptanceEstimator.recalibration(bound[1])
    add("ada --online @auto", head_threshold, recalibrated(head_threshold, estimator=learned),
        f"recalibrated online; after the last prompt s = {learned.slope:.3f}, b_0..b_4 = "
        + ", ".join(f"{b:.2f}" for b in learned.intercepts[:5]))
    best("ada --online, best threshold", THRESHOLDS, recalibrated)
    best("online, best threshold", THRESHOLDS, lambda t: online(t, OnlineAcceptanceEstimator(bound[1])),
         "vLLM's estimator learning over the prompts in order")
    seen: list = []  # what the online run at its best threshold labelled
    online(rows[-1]["setting"], OnlineAcceptanceEstimator(bound[1], history=seen))
    fitted = fit_offline(seen, bound[1])
    best("online fitted offline, best threshold", THRESHOLDS, lambda t: online(t, fitted.frozen()),
         f"the form fitted to convergence on the {len(seen)} observations online labelled at its best threshold, "
         f"frozen: slope {fitted.slope:.3f}, b_0..b_4 = " + ", ".join(f"{b:.2f}" for b in fitted.intercepts[:5]))
    best("verify-budget, best K", BLOCKS, lambda k: run(features, budget_length(
        k, plain, estimator=OnlineAcceptanceEstimator(bound[1])), plain),
        "vLLM's adaptive verification with the online estimator's survival scores")
    best("ada-budget, best K", BLOCKS, lambda k: run(predictions, budget_length(k, judged, judged=True), judged, True),
         "the same rule on the head's predictions")
    best("constant, best K", BLOCKS, lambda k: run(predictions, constant_length(k), plain))
    best("dynamic, best confidence", CONFIDENCES, lambda c: run(draft_probs, dynamic_length(c), plain))
    add("oracle", None, run(predictions, oracle_length, plain))
    if logit_shift:
        shifted_logits = [logits + logit_shift for logits in head_logits]
        shifted = [1.0 / (1.0 + np.exp(-logits)) for logits in shifted_logits]
        add(f"ada@auto, head logit {logit_shift:+g}", head_threshold,
            run(shifted, ada_length(head_threshold, bound[0]), judged, True), "a head that much too confident")
        learned = OnlineAcceptanceEstimator.recalibration(bound[1])
        add(f"ada --online @auto, head logit {logit_shift:+g}", head_threshold,
            recalibrated(head_threshold, shifted_logits, learned),
            f"after the last prompt s = {learned.slope:.3f}, b_0..b_4 = "
            + ", ".join(f"{b:.2f}" for b in learned.intercepts[:5]))
    return rows


def markdown(rows: list[dict], cost_ratio: float, title: str) -> str:
    """The table: each method's flat cost per token, against `ada@auto`, and its learning curve."""
    reference = rows[0]["flat_cost_per_token"]
    curve = [n for n in CURVE if str(n) in rows[0]["curve"]]
    lines = [f"## {title} (flat cost per token at c = {cost_ratio:g})", "",
             "| method | setting | flat cost/tok | ada@auto / this | " + " | ".join(f"first {n} prompts" for n in curve)
             + " | target calls/tok | draft calls/tok | measured cost/tok |",
             "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in curve) + " | ---: | ---: | ---: |"]
    notes = []
    for row in rows:
        setting = "" if row["setting"] is None else f"{row['setting']:g}"
        if row["note"]:
            notes.append(f"- {row['method']}: {row['note']}")
        lines.append(f"| {row['method']} | {setting} | {row['flat_cost_per_token']:.4f} | "
                     f"{reference / row['flat_cost_per_token']:.3f} | "
                     + " | ".join(f"{row['curve'][str(n)]:.4f}" for n in curve)
                     + f" | {row['target_calls_per_token']:.3f} | {row['draft_calls_per_token']:.3f} | "
                     f"{row['measured_cost_per_token']:.3f} |")
    return "\n".join(lines + [""] + notes)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", required=True, help="greedy records (build_data), one per prompt, in order")
    parser.add_argument("--head", default=HEAD, help="a proposer head folder with a stored threshold")
    parser.add_argument("--draft", default=DRAFT)
    parser.add_argument("--step_times_from", default=None, help="a head folder or calibration output holding step "
                        "times (default: --head's)")
    parser.add_argument("--bound", type=int, nargs=2, default=[1, 20])
    parser.add_argument("--cost_ratio", type=float, default=0.2, help="c: a draft step over a verification")
    parser.add_argument("--logit_shift", type=float, default=0.0, help="also the head with its logit raised by this, "
                        "with and without online recalibration")
    parser.add_argument("--title", default=None)
    parser.add_argument("--output", required=True, help="where TABLE.md and rows.json go (a folder)")
    args = parser.parse_args(argv)
    records = read_records(args.records)
    _, draft, head = load_pair(None, args.draft, args.head)
    labels, flat = predict(head, draft, records)
    calibration = calibration_report(labels, flat)
    predictions = np.split(flat, np.cumsum([len(r["p_acc"]) for r in records])[:-1])
    plain, judged = stored_step_times(args.step_times_from or args.head)
    rows = study(records, predictions, head.resolve_stop_threshold("auto"), tuple(args.bound), plain, judged,
                 args.cost_ratio, args.logit_shift)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    title = args.title or f"{Path(args.records).stem}, {len(records)} prompts, greedy"
    table = markdown(rows, args.cost_ratio, title) + (
        f"\n\nThe head on these records: ECE {calibration['ece']:.3f}, mean prediction "
        f"{calibration['mean_prediction']:.3f} against mean label {calibration['mean_label']:.3f}, "
        f"AUROC {calibration['auroc']:.3f}.")
    (output / "TABLE.md").write_text(table + "\n", encoding="utf-8")
    (output / "rows.json").write_text(json.dumps({"records": args.records, "head": args.head,
                                                  "cost_ratio": args.cost_ratio, "bound": args.bound,
                                                  "head_calibration": {k: v for k, v in calibration.items()
                                                                       if k != "bins"},
                                                  "rows": rows}, indent=1), encoding="utf-8")
    print(table)
    return rows


if __name__ == "__main__":
    main()
