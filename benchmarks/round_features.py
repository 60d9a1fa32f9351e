"""Do inputs that depend on the round carry more than the head's own prediction? (issue 20)

Replays `ada` with a head at its stored threshold over greedy dev records (the threshold replay's
rounds, `specdecpp.calibration.threshold.replayed_rounds`) and, for every token a round drafts, collects the
head's prediction and the inputs a decode loop knows for free: the token's position in the round,
the running log P(all accepted) before it, the previous round's accepted length, and the target's
entropy at the last verified token (the distribution the verification already computed; records
from `build_data` carry it as `target_entropy`). A logistic regression on the head's logit alone,
and on the logit plus each input, is fitted on half the records and scored (AUROC) on the other
half: an input that pays raises the held-out AUROC over the head alone.

    python benchmarks/round_features.py --head checkpoints/zoo/head --records data/generated/stdlib-train-dev.jsonl
"""
from __future__ import annotations

import argparse

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from specdecpp.calibration.threshold import ada_length, oracle_length, replayed_rounds
from specdecpp.data.io import read_records
from specdecpp.head.inputs import predict
from specdecpp.models import load_head, load_model

INPUTS = ("position in round", "running log P", "previous accepted length", "target entropy at round start")


def drafted_token_rows(records: list[dict], predictions: list[np.ndarray], threshold: float,
                       max_draft: int = 20) -> dict:
    """For every token drafted in greedy `ada` rounds (the replay's, `threshold.replayed_rounds` with
    `threshold.ada_length`: the engine's product rule, bound (1, max_draft)) after the first round of
    a record, its label, the head's prediction and `INPUTS`. ValueError on sampled records: their
    rounds are weighted by chance, and the rows here follow one path."""
    accept = [np.asarray(r["p_acc"], dtype=np.float64) for r in records]
    if not all(np.isin(a, (0.0, 1.0)).all() for a in accept):
        raise ValueError("the round features are replayed on greedy records only (p_acc 0 or 1)")
    rows = {name: [] for name in ("label", "prediction", "record", *INPUTS)}
    previous_accepted = {}  # record -> its last round's accepted length (none before its first round)
    for index, pos, _, k, _ in replayed_rounds(accept, predictions, ada_length(threshold, 1), max_draft):
        pred, log_p = predictions[index], 0.0
        for j in range(k):
            if index in previous_accepted:
                values = (j + 1, log_p, previous_accepted[index], records[index]["target_entropy"][pos - 1])
                for name, value in zip(("label", "prediction", "record", *INPUTS),
                                       (accept[index][pos + j], pred[pos + j], index, *values)):
                    rows[name].append(value)
            log_p += float(np.log(max(pred[pos + j], 1e-9)))
        previous_accepted[index] = oracle_length(None, accept[index], pos, k)
    return {name: np.asarray(values, dtype=np.float64) for name, values in rows.items()}


def held_out_auroc(rows: dict, inputs: tuple[str, ...]) -> float:
    """AUROC on the odd records of a logistic regression on the head's logit (+ `inputs`) fitted on
    the even ones."""
    p = np.clip(rows["prediction"], 1e-6, 1 - 1e-6)
    x = np.column_stack([np.log(p / (1 - p))] + [rows[name] for name in inputs])
    fit = rows["record"] % 2 == 0
    model = LogisticRegression(max_iter=1000).fit(x[fit], rows["label"][fit])
    return float(roc_auc_score(rows["label"][~fit], model.decision_function(x[~fit])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", default="checkpoints/zoo/head")
    parser.add_argument("--draft", default="checkpoints/zoo/draft")
    parser.add_argument("--records", default="data/generated/stdlib-train-dev.jsonl")
    args = parser.parse_args()
    records = read_records(args.records)
    if "target_entropy" not in records[0]:
        raise SystemExit(f"{args.records} has no target_entropy: rebuild it with specdecpp.data.build_data")
    head = load_head(args.head)
    flat = predict(head, load_model(args.draft, "float32"), records, batch_size=16)[1]
    bounds = np.cumsum([0] + [len(r["p_acc"]) for r in records])
    rows = drafted_token_rows(records, [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])], head.stop_threshold)
    print(f"{len(rows['label'])} drafted tokens judged in replayed rounds (threshold {head.stop_threshold:g})")
    print(f"| inputs | held-out AUROC |\n| --- | ---: |\n| head alone | {held_out_auroc(rows, ()):.4f} |")
    for name in INPUTS:
        print(f"| head + {name} | {held_out_auroc(rows, (name,)):.4f} |")
    print(f"| head + all four | {held_out_auroc(rows, INPUTS):.4f} |")


if __name__ == "__main__":
    main()
