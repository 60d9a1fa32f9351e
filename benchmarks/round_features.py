"""Do inputs that depend on the round carry more than the head's own prediction? (issue 20)

Replays `ada` with a head at its stored threshold over greedy dev records (`specdecpp.calibration.threshold`)
and, for every token a round drafts, collects the head's prediction and the inputs a decode loop
knows for free: the token's position in the round, the running log P(all accepted) before it, the
previous round's accepted length, and the target's entropy at the last verified token (the
distribution the verification already computed; records from `build_data` carry it as
`target_entropy`). A logistic regression on the head's logit alone, and on the logit plus each
input, is fitted on half the records and scored (AUROC) on the other half: an input that pays
raises the held-out AUROC over the head alone.

    python benchmarks/round_features.py --head checkpoints/zoo/head --records data/generated/stdlib-train-dev.jsonl
"""
from __future__ import annotations

import argparse

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from specdecpp.data.io import read_records
from specdecpp.models import load_head, load_model
from specdecpp.training.head_data import predict

INPUTS = ("position in round", "running log P", "previous accepted length", "target entropy at round start")


def judged_tokens(records: list[dict], predictions: list[np.ndarray], threshold: float, max_draft: int = 20) -> dict:
    """Replay greedy `ada` rounds (product rule, bound (1, max_draft)) over the records; for every
    drafted token after the first round of a record, its label, the head's prediction and `INPUTS`."""
    rows = {name: [] for name in ("label", "prediction", "record", *INPUTS)}
    for index, (record, pred) in enumerate(zip(records, predictions)):
        accept, entropy = record["p_acc"], record["target_entropy"]
        pos, previous_accepted, n = 0, None, len(accept)
        while pos < n:
            log_p, j, accepted = 0.0, 0, None
            while pos + j < min(n - 1, pos + max_draft):
                if previous_accepted is not None:
                    values = (j + 1, log_p, previous_accepted, entropy[pos - 1])
                    for name, value in zip(("label", "prediction", "record", *INPUTS),
                                           (accept[pos + j], pred[pos + j], index, *values)):
                        rows[name].append(value)
                log_p += float(np.log(max(pred[pos + j], 1e-9)))
                if accepted is None and not accept[pos + j]:
                    accepted = j
                j += 1
                if 1.0 - np.exp(log_p) > threshold:
                    break
            accepted = j if accepted is None else accepted
            previous_accepted, pos = accepted, pos + accepted + 1
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
    rows = judged_tokens(records, [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])], head.stop_threshold)
    print(f"{len(rows['label'])} drafted tokens judged in replayed rounds (threshold {head.stop_threshold:g})")
    print(f"| inputs | held-out AUROC |\n| --- | ---: |\n| head alone | {held_out_auroc(rows, ()):.4f} |")
    for name in INPUTS:
        print(f"| head + {name} | {held_out_auroc(rows, (name,)):.4f} |")
    print(f"| head + all four | {held_out_auroc(rows, INPUTS):.4f} |")


if __name__ == "__main__":
    main()
