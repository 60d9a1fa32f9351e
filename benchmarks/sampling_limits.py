"""What limits a sampling head? An offline study on sampled records, in expectation over `p_acc`.

Rounds are replayed on sampled dev records (`specdecpp.calibration.threshold.replay`: each proposal accepted
with its `p_acc = min(1, p/q)`) at flat prices: a draft step costs `c` (`--cost_ratio`) of a
verification and every verification costs the same, as on a GPU. Replayed beside each other:

- every constant K and our `dynamic` at a grid of confidences (the baselines a user would pick);
- the heads given with `--heads` (their `inputs.predict` on the dev records);
- small predictors fitted here on the training records' positions from named inputs: the draft's
  logit features (`head.FEATURES`: log q of the sampled token, the draft's entropy, the margin to the
  draft's top token, the token's rank) and, as a ceiling no deployable head reaches, the target's
  entropy at the position (`target_entropy` in the records); each fitted with the training loss
  (BCE on the soft labels) and, on the deployable inputs, with other losses (BCE weighting the
  reject side 6x, squared error, BCE on 0/1 labels drawn from `p_acc`);
- the ideal predictor, which knows each proposal's `p_acc`.

Each predictor stops rounds by the `ada` product rule (`1 - prod p_hat > t`) and by a per-token rule
(stop after a token whose `p_hat < t`), at the best `t` of a grid on the dev records (as the best K
and the best confidence are), so the table separates what the inputs limit, what the loss limits
and what the stop rule limits. Calibration against the soft labels: binary KL and ECE.

    python benchmarks/sampling_limits.py --train data/generated/stdlib-train-sampled-t1-train6188.jsonl \\
        --dev data/generated/stdlib-train-sampled-t1-dev.jsonl --heads outputs/curve/sampled-margin-6188 \\
        --output outputs/sampling-limits/t1
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from harness import DRAFT, load_pair
from tqdm import tqdm
from transformers import PreTrainedModel

from specdecpp.calibration.report import calibration_report
from specdecpp.calibration.threshold import (CONFIDENCES, THRESHOLDS, ada_length, constant_length, dynamic_length,
                                             replay)
from specdecpp.costs import StepTimes
from specdecpp.data.io import read_records
from specdecpp.head.inputs import predict
from specdecpp.head.model import FEATURES, AcceptancePredictionHead, logit_features
from specdecpp.head.objective import acceptance_loss
from specdecpp.models import model_device

@torch.no_grad()
def record_features(draft: PreTrainedModel, records: list[dict], names: list[str]) -> list[np.ndarray]:
    """The named `logit_features` of each record's proposals: one `[len(p_acc), len(names)]` array per record."""
    device = model_device(draft)
    features = []
    for record in tqdm(records, desc="features", unit="record"):
        ids = torch.tensor([record["prefix"] + record["tokens"][:-1]], device=device)
        logits = draft(input_ids=ids).logits[0, len(record["prefix"]) - 1:]
        features.append(logit_features(logits, torch.tensor(record["draft"], device=device), names).cpu().numpy())
    return features


DEPLOYABLE = ["log_q", "entropy", "margin", "log_rank"]
INPUT_SETS = {  # name -> (draft features, reads the target's entropy)
    "log q, entropy": (["log_q", "entropy"], False),
    "+ margin": (["log_q", "entropy", "margin"], False),
    "+ margin, log rank": (DEPLOYABLE, False),
    "+ target entropy (ceiling)": (DEPLOYABLE, True),
}
LOSSES = ("bce", "bce-reject-6x", "squared", "bce-0/1-draws")


def fit_predictor(x: np.ndarray, y: np.ndarray, loss: str, epochs: int = 4, seed: int = 0):
    """A small MLP (2 x 64, SiLU) from standardised inputs `x` to P(accept), fitted on the soft
    labels `y` with `loss` (see `LOSSES`). Returns a function from inputs to predictions."""
    torch.manual_seed(seed)
    mean, std = x.mean(0), x.std(0) + 1e-6
    inputs = torch.tensor((x - mean) / std, dtype=torch.float32)
    labels = torch.tensor(y, dtype=torch.float32)
    if loss == "bce-0/1-draws":
        labels = torch.bernoulli(labels, generator=torch.Generator().manual_seed(seed))
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.SiLU(), torch.nn.Linear(64, 64),
                              torch.nn.SiLU(), torch.nn.Linear(64, 2))
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    steps = epochs * (len(x) // 2048 + 1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    for _ in range(epochs):
        for batch in torch.randperm(len(x)).split(2048):
            logits = net(inputs[batch])
            if loss == "squared":
                value = ((logits.softmax(-1)[:, 1] - labels[batch]) ** 2).mean()
            else:
                value = acceptance_loss(logits, labels[batch], 6.0 if loss == "bce-reject-6x" else 1.0)
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
            schedule.step()

    def predictor(new: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return net(torch.tensor((new - mean) / std, dtype=torch.float32)).softmax(-1)[:, 1].double().numpy()
    return predictor


def best_cost(accept: list[np.ndarray], predictions: list[np.ndarray], rule, grid, times: StepTimes,
              max_draft: int) -> tuple[float, float]:
    """The lowest flat cost per token over `grid` for `rule(t)`, and the `t` that gives it."""
    costs = [(replay(accept, predictions, rule(t), max_draft, times)["flat_cost_per_token"], t) for t in grid]
    return min(costs)


def split(flat: np.ndarray, records: list[dict]) -> list[np.ndarray]:
    """A flat array over every position back into one array per record."""
    bounds = np.cumsum([0] + [len(r["p_acc"]) for r in records])
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def study(train: list[dict], dev: list[dict], draft, heads: list[str], cost_ratio: float,
          bound: tuple[int, int]) -> list[dict]:
    """The rows of the study (see the module docstring): one per rule and predictor, with its best
    flat cost per token, its threshold and, for predictors, its calibration on the dev records."""
    times = StepTimes(draft_ms=[cost_ratio], verify_ms=[1.0] * (bound[1] + 1), target_alone_ms=1.0)
    accept = [np.asarray(r["p_acc"], dtype=np.float64) for r in dev]
    labels = np.concatenate(accept)
    rows = []

    def add(name: str, kind: str, predictions: list[np.ndarray] | None, cost: tuple[float, float] | None = None):
        product = cost or best_cost(accept, predictions, lambda t: ada_length(t, bound[0]), THRESHOLDS, times,
                                    bound[1])
        row = {"predictor": name, "kind": kind, "cost_per_token": round(product[0], 4), "at": product[1]}
        if predictions is not None:
            per_token = best_cost(accept, predictions, dynamic_length, THRESHOLDS, times, bound[1])
            row.update(per_token_rule=round(per_token[0], 4), per_token_at=per_token[1])
            report = calibration_report(labels, np.concatenate(predictions))
            row.update(binary_kl=round(report["binary_kl"], 4), ece=round(report["ece"], 4))
        rows.append(row)

    for k in range(1, 7):
        add(f"constant K={k}", "baseline", None,
            (replay(accept, accept, constant_length(k), bound[1], times)["flat_cost_per_token"], k))
    draft_probs = [np.exp(np.asarray(r["log_p_draft"], dtype=np.float64)) for r in dev]
    add("dynamic", "baseline", None, best_cost(accept, draft_probs, dynamic_length, CONFIDENCES + (0.1, 0.7, 0.8),
                                               times, bound[1]))
    for path in heads:
        head = AcceptancePredictionHead.from_pretrained(path).eval()
        add(f"head {path}", "trained head", split(predict(head, draft, dev)[1], dev))

    train_x = np.concatenate(record_features(draft, train, DEPLOYABLE))
    dev_x = np.concatenate(record_features(draft, dev, DEPLOYABLE))
    train_y = np.concatenate([r["p_acc"] for r in train])
    train_h = np.concatenate([r["target_entropy"] for r in train])[:, None]
    dev_h = np.concatenate([r["target_entropy"] for r in dev])[:, None]
    for name, (features, target_entropy) in INPUT_SETS.items():
        columns = [DEPLOYABLE.index(f) for f in features]
        x, new = train_x[:, columns], dev_x[:, columns]
        if target_entropy:
            x, new = np.hstack([x, train_h]), np.hstack([new, dev_h])
        for loss in LOSSES if features == DEPLOYABLE and not target_entropy else ("bce",):
            fitted = fit_predictor(x, train_y, loss)
            add(f"{name} [{loss}]", "ceiling" if target_entropy else "fitted here", split(fitted(new), dev))
    add("ideal: knows each p_acc", "ceiling", accept)
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table, each cost beside its change against the best constant K."""
    best_k = min(r["cost_per_token"] for r in rows if r["predictor"].startswith("constant"))

    def vs(cost: float) -> str:
        return f"{cost:.4f} ({cost / best_k - 1:+.1%})"
    lines = ["| predictor | kind | product rule: cost/tok (vs best K) | at | per-token rule | at | binary KL | ECE |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        per_token = vs(r["per_token_rule"]) if "per_token_rule" in r else "–"
        lines.append(f"| {r['predictor']} | {r['kind']} | {vs(r['cost_per_token'])} | {r['at']:g} | {per_token} | "
                     f"{r.get('per_token_at', '–')} | {r.get('binary_kl', '–')} | {r.get('ece', '–')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True, help="sampled training records (JSON Lines)")
    parser.add_argument("--dev", required=True, help="sampled dev records (JSON Lines)")
    parser.add_argument("--draft", default=DRAFT)
    parser.add_argument("--heads", nargs="*", default=[], help="trained proposer heads to replay beside")
    parser.add_argument("--n_train", type=int, default=None, help="fit on the first N training records")
    parser.add_argument("--cost_ratio", type=float, default=0.2, help="c: a draft step over a verification")
    parser.add_argument("--bound", type=int, nargs=2, default=(1, 20))
    parser.add_argument("--output", default=None, help="folder for limits.md and limits.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    _, draft, _ = load_pair(None, args.draft)
    train, dev = read_records(args.train)[:args.n_train], read_records(args.dev)
    if any("target_entropy" not in r for r in train + dev):
        raise ValueError("the records lack target_entropy (built before it was recorded): rebuild them")
    rows = study(train, dev, draft, args.heads, args.cost_ratio, tuple(args.bound))
    table = markdown(rows)
    header = (f"Sampled records: {len(train)} training, {len(dev)} dev ({sum(len(r['p_acc']) for r in dev)} "
              f"positions, mean p_acc {np.mean(np.concatenate([r['p_acc'] for r in dev])):.3f}); flat prices "
              f"c = {args.cost_ratio}; bound {tuple(args.bound)}; features {', '.join(FEATURES)}.")
    print(header + "\n\n" + table)
    if args.output:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        (out / "limits.md").write_text(header + "\n\n" + table + "\n")
        (out / "limits.json").write_text(json.dumps({"settings": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
