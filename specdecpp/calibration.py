"""Calibration report of a trained acceptance head: can its probabilities be trusted?

    python -m specdecpp.calibration --head HEAD --draft DRAFT --data_path dev.jsonl [--plot_path reliability.png]

The `ada` schedule stops drafting on the head's predicted probability of a rejection, so a stop
threshold only means what it says if those probabilities are calibrated. On held-out records
(built as for training, same mixing ratio and seed as training's eval split) this prints the
expected calibration error (ECE), the Brier score, the AUROC of accept vs reject, the binary KL
(training's eval metric) and the per-bin table, and writes a reliability diagram.
Labels are the records' soft `p_acc`: each bin compares the mean prediction with the mean label,
and the AUROC weighs every position as an accept with weight `p_acc` and a reject with `1 - p_acc`.

A head trained with `--weight_mismatch w` is pessimistic by design: the weighted BCE is minimised
by `s = y / (y + w (1 - y))`, not by `y`. Its raw probabilities (what the stop rule reads) are
reported by default; `--weight_mismatch w` reports the calibration of `w s / (1 - s + w s)`, the
acceptance probability the head implies, which is what should match the labels.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm
from transformers import HfArgumentParser

from specdecpp.data_io import read_records
from specdecpp.head import AcceptancePredictionHead
from specdecpp.models import ModelLoadingArguments, last_hidden_states, load_model, model_device
from specdecpp.train import IGNORE, binary_kl, check_data_fits_draft, make_example, pad_batch


@dataclass
class CalibrationArguments:
    head: str = field(metadata={"help": "the trained head: a folder or a Hub id"})
    draft: str = field(metadata={"help": "the draft model the head was trained on"})
    data_path: str = field(metadata={"help": "held-out records (JSON Lines or the reference's JSON)"})
    mixing_ratio: float = field(default=0.15, metadata={"help": "as in training (its eval split uses the same draws)"})
    seed: int = field(default=42, metadata={"help": "mixing seed; training's default --seed is 42"})
    batch_size: int = field(default=8, metadata={"help": "records per draft forward"})
    num_bins: int = field(default=10, metadata={"help": "equal-width probability bins"})
    weight_mismatch: float = field(default=1.0, metadata={
        "help": "the head's training weight w: undo it (w s / (1 - s + w s)) before comparing with the labels; "
                "1 judges the raw predictions"})
    plot_path: str = field(default="reliability.png", metadata={"help": "where the reliability diagram goes"})
    output_json: str | None = field(default=None, metadata={"help": "also write the report as JSON here"})

    def __post_init__(self):
        if self.num_bins < 1 or self.batch_size < 1:
            raise ValueError(f"num_bins and batch_size must be >= 1, got {self.num_bins}, {self.batch_size}")
        if self.weight_mismatch <= 0:
            raise ValueError(f"weight_mismatch must be > 0, got {self.weight_mismatch}")
        if not 0 <= self.mixing_ratio < 1:
            raise ValueError(f"mixing_ratio must be in [0, 1), got {self.mixing_ratio}")


@torch.no_grad()
def predict(head: AcceptancePredictionHead, draft, records: list[dict], mixing_ratio: float = 0.15, seed: int = 42,
            batch_size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """`(labels, predictions)` over every labelled position of the records: `p_acc` and the head's
    accept probability, on the same sequences training builds from the records."""
    if head.hidden_size != draft.config.get_text_config().hidden_size:
        raise ValueError(f"the head reads hidden states of size {head.hidden_size} but the draft's hidden size is "
                         f"{draft.config.get_text_config().hidden_size}: it was trained for another draft")
    device = model_device(draft)
    head = head.to(device)
    labels, predictions = [], []
    for start in tqdm(range(0, len(records), batch_size), desc="scoring", unit="batch"):
        batch = pad_batch([make_example(r, start + i, mixing_ratio, seed)
                           for i, r in enumerate(records[start: start + batch_size])])
        hidden = last_hidden_states(draft, batch["input_ids"].to(device), batch["attention_mask"].to(device))
        keep = batch["labels"] != IGNORE
        labels.append(batch["labels"][keep].numpy())
        predictions.append(head.accept_prob(hidden).cpu()[keep].numpy())
    return np.concatenate(labels).astype(np.float64), np.concatenate(predictions).astype(np.float64)


def unweight(predictions: np.ndarray, weight_mismatch: float) -> np.ndarray:
    """The acceptance probability a head trained with reject weight `w` implies: it learns
    `s = y / (y + w (1 - y))`, so `y = w s / (1 - s + w s)` (the identity for w = 1)."""
    return weight_mismatch * predictions / (1 - predictions + weight_mismatch * predictions)


def soft_auroc(labels: np.ndarray, predictions: np.ndarray) -> float:
    """AUROC of accept vs reject with soft labels: each position counts as an accept with weight
    `y` and as a reject with weight `1 - y` (the ordinary AUROC when labels are 0/1); NaN when
    the data holds only accepts or only rejects."""
    from sklearn.metrics import roc_auc_score

    y_true = np.concatenate([np.ones_like(labels), np.zeros_like(labels)])
    weights = np.concatenate([labels, 1 - labels])
    scores = np.concatenate([predictions, predictions])
    if weights[y_true == 1].sum() == 0 or weights[y_true == 0].sum() == 0:
        return float("nan")
    keep = weights > 0
    return float(roc_auc_score(y_true[keep], scores[keep], sample_weight=weights[keep]))


def calibration_report(labels: np.ndarray, predictions: np.ndarray, num_bins: int = 10) -> dict:
    """ECE (count-weighted mean |mean prediction - mean label| over equal-width bins), Brier score,
    AUROC, binary KL, the base rates, and the bins themselves."""
    if len(labels) == 0:
        raise ValueError("no labelled positions to evaluate")
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    index = np.clip(np.digitize(predictions, edges[1:-1]), 0, num_bins - 1)
    bins, ece = [], 0.0
    for b in range(num_bins):
        in_bin = index == b
        count = int(in_bin.sum())
        mean_pred = float(predictions[in_bin].mean()) if count else None
        mean_label = float(labels[in_bin].mean()) if count else None
        if count:
            ece += count / len(labels) * abs(mean_pred - mean_label)
        bins.append({"low": float(edges[b]), "high": float(edges[b + 1]), "count": count,
                     "mean_prediction": mean_pred, "mean_label": mean_label})
    return {"positions": int(len(labels)), "ece": float(ece), "brier": float(np.mean((predictions - labels) ** 2)),
            "auroc": soft_auroc(labels, predictions), "binary_kl": binary_kl(labels, predictions),
            "mean_label": float(labels.mean()), "mean_prediction": float(predictions.mean()), "bins": bins}


def plot_reliability(report: dict, path: str, title: str = "") -> None:
    """The reliability diagram: mean label against mean prediction per bin (on the diagonal when
    calibrated), with the number of positions per bin below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    filled = [b for b in report["bins"] if b["count"]]
    width = report["bins"][0]["high"] - report["bins"][0]["low"]
    top.bar([b["low"] for b in filled], [b["mean_label"] for b in filled], width=width, align="edge",
            edgecolor="black", alpha=0.7, label="observed accept rate")
    top.plot([b["mean_prediction"] for b in filled], [b["mean_label"] for b in filled], "o", color="C1",
             label="(mean prediction, mean label)")
    top.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    top.set(xlim=(0, 1), ylim=(0, 1), ylabel="accept rate (mean p_acc)",
            title=f"{title}\nECE {report['ece']:.3f}  Brier {report['brier']:.3f}  AUROC {report['auroc']:.3f}".strip())
    top.legend(loc="upper left", fontsize=8)
    bottom.bar([b["low"] for b in report["bins"]], [b["count"] for b in report["bins"]], width=width, align="edge",
               edgecolor="black", color="gray")
    bottom.set(xlabel="predicted accept probability", ylabel="positions")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_report(report: dict) -> str:
    """The report as a short text table."""
    lines = [f"positions        {report['positions']}",
             f"ECE              {report['ece']:.4f}",
             f"Brier score      {report['brier']:.4f}",
             f"AUROC            {report['auroc']:.4f}",
             f"binary KL        {report['binary_kl']:.4f}",
             f"mean label       {report['mean_label']:.4f}   mean prediction {report['mean_prediction']:.4f}",
             "", "bin           count  mean pred  mean label"]
    for b in report["bins"]:
        pred = f"{b['mean_prediction']:.3f}" if b["count"] else "-"
        label = f"{b['mean_label']:.3f}" if b["count"] else "-"
        lines.append(f"[{b['low']:.2f}, {b['high']:.2f})  {b['count']:6d}  {pred:>9}  {label:>10}")
    return "\n".join(lines)


def run(args: CalibrationArguments, loading: ModelLoadingArguments | None = None) -> dict:
    """Score the records, print the report, write the diagram (and JSON); returns the report."""
    loading = loading or ModelLoadingArguments()
    records = read_records(args.data_path)  # bad data fails before any model loads
    head = AcceptancePredictionHead.from_pretrained(args.head)
    draft = load_model(args.draft, loading.torch_dtype, loading.device_map, loading.trust_remote_code)
    check_data_fits_draft(records, draft)
    if loading.device_map is None and torch.cuda.is_available():
        draft = draft.to("cuda")
    labels, predictions = predict(head, draft, records, args.mixing_ratio, args.seed, args.batch_size)
    report = calibration_report(labels, unweight(predictions, args.weight_mismatch), args.num_bins)
    print(format_report(report))
    title = f"head {args.head}" + (f" (w={args.weight_mismatch:g} undone)" if args.weight_mismatch != 1 else "")
    plot_reliability(report, args.plot_path, title=title)
    print(f"reliability diagram: {args.plot_path}")
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return report


def main(argv: list[str] | None = None) -> None:
    """Command line: `python -m specdecpp.calibration --help`."""
    parser = HfArgumentParser((CalibrationArguments, ModelLoadingArguments))
    args, loading = parser.parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
    run(args, loading)


if __name__ == "__main__":
    main()
