"""Would a judgement from the draft's logit features alone (no hidden state, no head weights) make
`ada` the fastest schedule? An offline replay, for issue 20's features-only question.

A cubic logistic regression on (log q of the proposal, entropy of q) is fitted on the training
records and predicts acceptance on the dev records; its rounds are replayed with the step times the
zoo head's threshold selection measured (`threshold_selection.step_times`, the plain draft steps:
no hidden states, no head weights in the caches) and a judgement of `--judge_ms` (the features'
own cost in the loop is ~0.016 ms), beside our `dynamic` schedule and the v2 head's stored curve.

    python benchmarks/features_only_replay.py     # needs data/generated/stdlib-train-{train,dev}.jsonl
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
from harness import DRAFT, HEAD, load_pair
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import PolynomialFeatures

from specdecpp.calibration.threshold import ada_length, dynamic_length, replay
from specdecpp.costs import MEASURED_COST, StepTimes
from specdecpp.data.io import read_records
from specdecpp.head.inputs import record_features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", default="data/generated/stdlib-train-train.jsonl")
    parser.add_argument("--dev", default="data/generated/stdlib-train-dev.jsonl")
    parser.add_argument("--judge_ms", type=float, default=0.02)
    args = parser.parse_args()
    _, draft, _ = load_pair(None, DRAFT)
    train, dev = read_records(args.train), read_records(args.dev)
    poly = PolynomialFeatures(3)
    train_x = np.concatenate(record_features(draft, train, ["log_q", "entropy"]))
    train_y = np.concatenate([r["p_acc"] for r in train]) > 0.5
    model = LogisticRegression(max_iter=2000).fit(poly.fit_transform(train_x), train_y)
    predictions = [model.predict_proba(poly.transform(x))[:, 1] for x in record_features(draft, dev, ["log_q", "entropy"])]
    accept = [np.asarray(r["p_acc"], dtype=np.float64) for r in dev]
    print(f"features-only AUROC on dev: {roc_auc_score(np.concatenate(accept) > 0.5, np.concatenate(predictions)):.3f}")

    selection = json.loads((Path(HEAD) / "config.json").read_text())["threshold_selection"]
    plain = StepTimes(**selection["step_times"])
    unit = plain.target_alone_ms
    cheap = replace(plain, judge_ms=args.judge_ms)
    print(f"replayed {MEASURED_COST}:")
    for threshold in (0.3, 0.4, 0.5, 0.6, 0.7):
        cost = replay(accept, predictions, ada_length(threshold, 1), 20, cheap, True, unit)["cost_per_token"]
        print(f"features-only ada@{threshold}: {cost:.4f}")
    draft_probs = [np.exp(np.asarray(r["log_p_draft"])) for r in dev]
    for confidence in (0.3, 0.4):
        cost = replay(accept, draft_probs, dynamic_length(confidence), 20, plain, False, unit)["cost_per_token"]
        print(f"dynamic@{confidence}: {cost:.4f}")
    best = min(zip(selection["cost_per_token"], selection["thresholds"]))
    print(f"v2 head (stored curve): {best[0]:.4f} at {best[1]}")


if __name__ == "__main__":
    main()
