"""Does the distance since the last known rejection add to the head's P(accept)?
Head predictions on train (subset) and dev records; a logistic recalibration with history features fitted on
train; greedy rounds simulated on dev as the loop takes them (features known at run time only), priced with
the head's stored compiled step times. From the repository root:

    python results/clock-96-prompts/history_feature.py 1500   # history_feature.txt
"""
import sys
import numpy as np
import torch
sys.path.insert(0, "benchmarks")
from harness import HEAD, load_pair  # noqa
from specdecpp.data.io import read_records
from specdecpp.head.inputs import predict
from specdecpp.costs import StepTimes

torch.set_num_threads(1)
target, draft, head = load_pair(head=HEAD)
ntrain = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
train = read_records("data/generated/stdlib-train-train6188.jsonl")[:ntrain]
dev = read_records("data/generated/stdlib-train-dev.jsonl")


def split(records, flat):
    b = np.cumsum([0] + [len(r["p_acc"]) for r in records])
    return [flat[x:y] for x, y in zip(b[:-1], b[1:])]


ptr = split(train, predict(head, draft, train)[1])
pdv = split(dev, predict(head, draft, dev)[1])
acc_tr = [np.asarray(r["p_acc"]) for r in train]
acc_dv = [np.asarray(r["p_acc"]) for r in dev]
lq_dv = [np.asarray(r["log_p_draft"]) for r in dev]


def logit(p):
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def feats(p, d):
    """history features: d = positions since the last known rejection (large when none)."""
    d = np.minimum(d, 64)
    return np.stack([logit(p), np.log1p(d), (d <= 1).astype(float), (d <= 3).astype(float), np.ones_like(p)], -1)


# train-view distances: every earlier position known
X, y = [], []
for p, a in zip(ptr, acc_tr):
    last = -100
    d = np.empty(len(a))
    for i in range(len(a)):
        d[i] = i - last
        if a[i] == 0:
            last = i
    X.append(feats(p, d)); y.append(a)
X, y = np.concatenate(X), np.concatenate(y)
w = np.zeros(X.shape[1]); w[0] = 1.0
for _ in range(200):  # Newton's method for logistic regression
    z = X @ w; q = 1 / (1 + np.exp(-z))
    g = X.T @ (q - y); H = (X * (q * (1 - q))[:, None]).T @ X + 1e-6 * np.eye(len(w))
    w -= np.linalg.solve(H, g)
print("weights", np.round(w, 3))

times = StepTimes(**head.threshold_selection["judged_step_times"])


def simulate(rule, records_acc):
    ms, tokens, tc, dc = 0.0, 0, 0, 0
    for r, a in enumerate(records_acc):
        n, pos, last = len(a), 0, -100
        while pos < n:
            limit = min(20, n - pos - 1)
            k = rule(r, pos, last, limit)
            acc = 0
            while acc < k and a[pos + acc] == 1:
                acc += 1
            if acc < k:
                last = pos + acc
            ms += times.round_ms(k, k); tc += 1; dc += k
            pos += acc + 1
        tokens += n
    # (cost per token in target-alone steps, target calls per token, draft calls per token)
    return ms / tokens / times.target_alone_ms, tc / tokens, dc / tokens


def ada_rule(th, use_hist):
    def rule(r, pos, last, limit):
        prod, j = 1.0, 0
        while j < limit:
            j += 1
            p = pdv[r][pos + j - 1]
            if use_hist:
                d = np.array([pos + j - 1 - last], dtype=float)
                p = float((1 / (1 + np.exp(-(feats(np.array([p]), d) @ w))))[0])
            prod *= p
            if 1 - prod > th:
                break
        return j
    return rule


def dyn_rule(c):
    def rule(r, pos, last, limit):
        j = 0
        while j < limit:
            j += 1
            if np.exp(lq_dv[r][pos + j - 1]) < c:
                break
        return j
    return rule


for c in (0.3, 0.4, 0.5):
    print(f"dynamic@{c}", np.round(simulate(dyn_rule(c), acc_dv), 4))
for th in (0.2, 0.25, 0.3, 0.35, 0.4):
    print(f"ada@{th}", np.round(simulate(ada_rule(th, False), acc_dv), 4),
          "hist", np.round(simulate(ada_rule(th, True), acc_dv), 4))
