"""Calibration report of a trained acceptance head on held-out records, `python -m specdecpp.calibration.report
--head HEAD --draft DRAFT --records dev.jsonl`: ECE, Brier, AUROC, binary KL, a reliability diagram (by candidate
rank too); `--choose_threshold --target TARGET` also chooses and stores the head's threshold."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.figure import Figure  # not pyplot: no backend chosen for the process
from transformers import HfArgumentParser

from specdecpp.calibration.threshold import choose_threshold
from specdecpp.checks import check_data_fits_draft
from specdecpp.cli import common_field, input_errors, option
from specdecpp.costs import FLAT_COST, MEASURED_COST, StepTimes, flat_costs
from specdecpp.data.io import atomic_write, read_records
from specdecpp.engine.settings import default
from specdecpp.head.folder import REPLAYED_ROUNDS, stored_step_times
from specdecpp.head.inputs import predict
from specdecpp.head.model import AcceptancePredictionHead
from specdecpp.head.objective import IGNORE, binary_kl
from specdecpp.measuring.step_timing import torch_threads
from specdecpp.models import HeadPairArguments, load_head, load_model


@dataclass
class CalibrationArguments:
    """What to report, next to the pair (`HeadPairArguments`)."""

    records: str = common_field("records", aliases=("--data_path",), help="held-out records (JSON Lines or JSON)")
    mixing_ratio: float = option(0.15, "as in training (its eval split uses the same draws)")
    seed: int = common_field("seed", default=42, help="mixing seed; training's default --seed is 42")
    batch_size: int = option(8, "records per draft forward")
    num_bins: int = option(10, "equal-width probability bins")
    weight_mismatch: float = option(1.0, "the head's training weight w: undo it (w s / (1 - s + w s)) before comparing "
        "with the labels; 1 judges the raw predictions")
    plot_path: str = option("reliability.png", "where the reliability diagram goes")
    output: str | None = common_field("output", default=None, help="also write the report as JSON here")
    choose_threshold: bool = option(False, "also choose the head's stop threshold by replaying rounds on these records "
        "(in their decoding mode) at the pair's measured costs, and store it (needs --target and a proposer head)")
    bound: list[int] = option(list(default("bound")), "ada's MIN MAX drafted tokens per round (for --choose_threshold)")
    rank_plot_path: str | None = option(None, "reliability diagram by candidate rank, with candidates (default: "
        "reliability_by_rank.png beside --plot_path)")
    threshold_plot_path: str | None = option(None, "--choose_threshold's cost-against-threshold plot (default: "
        "threshold.png beside --plot_path)")
    step_times_from: str | None = option(None, "a head folder (or calibration --output file) whose step times "
        "--choose_threshold replays with instead of timing the pair now (so heads compared are priced alike)")
    compile: bool = option(False, "--choose_threshold times the compiled engine's steps (decoding will run with "
        "compile=True); the selection records which engine its times came from")
    threads: int = option(1, "torch CPU threads while --choose_threshold times the steps: the count decoding will use, "
        "as step times hold for that count only (1 in `specdecpp head`); 0: torch's default")

    def __post_init__(self):
        if self.num_bins < 1 or self.batch_size < 1:
            raise ValueError(f"num_bins and batch_size must be >= 1, got {self.num_bins}, {self.batch_size}")
        if self.weight_mismatch <= 0:
            raise ValueError(f"weight_mismatch must be > 0, got {self.weight_mismatch}")
        if not 0 <= self.mixing_ratio < 1:
            raise ValueError(f"mixing_ratio must be in [0, 1), got {self.mixing_ratio}")
        if len(self.bound) != 2 or not 1 <= self.bound[0] <= self.bound[1]:
            raise ValueError(f"--bound takes MIN MAX with 1 <= MIN <= MAX, got {self.bound}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        folder = os.path.dirname(str(self.plot_path))
        self.rank_plot_path = self.rank_plot_path or os.path.join(folder, "reliability_by_rank.png")
        self.threshold_plot_path = self.threshold_plot_path or os.path.join(folder, "threshold.png")


def unweight(predictions: np.ndarray, weight_mismatch: float) -> np.ndarray:
    """The acceptance probability `y = w s / (1 - s + w s)` behind a prediction `s` of a head of reject weight `w`."""
    return weight_mismatch * predictions / (1 - predictions + weight_mismatch * predictions)


def soft_auroc(labels: np.ndarray, predictions: np.ndarray) -> float:
    """AUROC with soft labels (an accept of weight `y` and a reject of weight `1 - y`); NaN with one class."""
    from sklearn.metrics import roc_auc_score

    y_true = np.concatenate([np.ones_like(labels), np.zeros_like(labels)])
    weights = np.concatenate([labels, 1 - labels])
    scores = np.concatenate([predictions, predictions])
    if weights[y_true == 1].sum() == 0 or weights[y_true == 0].sum() == 0:
        return float("nan")
    keep = weights > 0
    return float(roc_auc_score(y_true[keep], scores[keep], sample_weight=weights[keep]))


def calibration_report(labels: np.ndarray, predictions: np.ndarray, num_bins: int = 10) -> dict:
    """ECE over equal-width bins, Brier score, AUROC, binary KL, the base rates, and the bins themselves."""
    if len(labels) == 0:
        raise ValueError("no labelled positions to evaluate")
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    index = np.clip(np.digitize(predictions, edges[1:-1]), 0, num_bins - 1)
    bins, ece = [], 0.0
    for b in range(num_bins):
        in_bin = index == b
        count = int(in_bin.sum())
        mean_pred, mean_label = (float(predictions[in_bin].mean()), float(labels[in_bin].mean())) if count \
            else (None, None)
        ece += count / len(labels) * abs(mean_pred - mean_label) if count else 0.0
        bins.append({"low": float(edges[b]), "high": float(edges[b + 1]), "count": count,
                     "mean_prediction": mean_pred, "mean_label": mean_label})
    return {"positions": int(len(labels)), "ece": float(ece), "brier": float(np.mean((predictions - labels) ** 2)),
            "auroc": soft_auroc(labels, predictions), "binary_kl": binary_kl(labels, predictions),
            "mean_label": float(labels.mean()), "mean_prediction": float(predictions.mean()), "bins": bins}


def rank_report(labels: np.ndarray, predictions: np.ndarray, num_bins: int = 10) -> dict:
    """`calibration_report` per candidate rank (IGNORE where a position has fewer), of ranks 2+ and of all."""
    ranks = {str(j + 1): np.s_[:, j] for j in range(labels.shape[1])} | {"2+": np.s_[:, 1:], "all": np.s_[:, :]}
    report = {}
    for name, columns in ranks.items():
        keep = labels[columns] != IGNORE
        if keep.any():
            report[name] = calibration_report(labels[columns][keep], predictions[columns][keep], num_bins)
    return report


def format_rank_report(report: dict) -> str:
    lines = ["by candidate rank (1: the drafted token)",
             "rank   positions  mean label  mean pred     ECE   AUROC  binary KL"]
    for name, r in report.items():
        lines.append(f"{name:<5}  {r['positions']:9d}  {r['mean_label']:10.4f}  {r['mean_prediction']:9.4f}  "
                     f"{r['ece']:6.4f}  {r['auroc']:6.4f}  {r['binary_kl']:9.4f}")
    return "\n".join(lines)


def plot_rank_reliability(report: dict, path: str, title: str = "") -> None:
    """Mean label against mean prediction per bin, one line per candidate rank."""
    fig = Figure(figsize=(5, 5))
    ax = fig.subplots()
    for name, r in report.items():
        if name == "all":
            continue
        filled = [b for b in r["bins"] if b["count"]]
        ax.plot([b["mean_prediction"] for b in filled], [b["mean_label"] for b in filled], "o-",
                label=f"rank {name}: ECE {r['ece']:.3f}, AUROC {r['auroc']:.3f}, n {r['positions']}")
    ax.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="predicted accept probability", ylabel="accept rate (mean label)",
           title=f"{title}\nby candidate rank".strip())
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_reliability(report: dict, path: str, title: str = "") -> None:
    """The reliability diagram (mean label against mean prediction per bin) over the positions per bin."""
    fig = Figure(figsize=(5, 6))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
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


def format_report(report: dict) -> str:
    lines = [f"positions        {report['positions']}",
             f"ECE              {report['ece']:.4f}",
             f"Brier score      {report['brier']:.4f}",
             f"AUROC            {report['auroc']:.4f}",
             f"binary KL        {report['binary_kl']:.4f}",
             f"mean label       {report['mean_label']:.4f}   mean prediction {report['mean_prediction']:.4f}",
             "", "bin           count  mean pred  mean label"]
    for b in report["bins"]:
        pred, label = (f"{b['mean_prediction']:.3f}", f"{b['mean_label']:.3f}") if b["count"] else ("-", "-")
        lines.append(f"[{b['low']:.2f}, {b['high']:.2f})  {b['count']:6d}  {pred:>9}  {label:>10}")
    return "\n".join(lines)


def check_outputs(args: CalibrationArguments) -> None:
    """FileNotFoundError for an output path in a folder that does not exist."""
    outputs = {"--plot_path": args.plot_path, "--output": args.output, "--rank_plot_path": args.rank_plot_path,
               "--threshold_plot_path": args.threshold_plot_path if args.choose_threshold else None}
    for flag, path in outputs.items():
        if path and not os.path.isdir(folder := os.path.dirname(os.path.abspath(path))):
            raise FileNotFoundError(f"{flag} {path}: no folder {folder}; create it or choose another path")


def run(pair: HeadPairArguments, args: CalibrationArguments) -> dict:
    """Score the records with `pair`'s head and draft, print and plot the report (and store a threshold); return it."""
    pair.require("head", "draft")
    head_dir = pair.single_head()
    if args.choose_threshold and not (pair.target and os.path.isdir(head_dir)):
        raise ValueError("--choose_threshold needs --target (its verification times price the rounds) and a "
                         "local --head folder to store the threshold in")
    check_outputs(args)
    records = read_records(args.records)  # bad data fails before any model loads
    head = load_head(head_dir)
    if args.choose_threshold and head.alignment != "proposer":  # refused now, not after scoring every record
        raise ValueError(f"--choose_threshold needs a proposer head, and {head_dir} is a {head.alignment} head: "
                         "choosing a threshold replays rounds from the head's predictions on the records, which "
                         "hold the states a proposer head judges only (train one with --head_alignment proposer)")
    draft = load_model(pair.draft, **pair.loading())
    check_data_fits_draft(records, draft)
    if pair.device is None and torch.cuda.is_available():
        draft = draft.to("cuda")
    labels, predictions = predict(head, draft, records, args.mixing_ratio, args.seed, args.batch_size)
    report = calibration_report(labels, unweight(predictions, args.weight_mismatch), args.num_bins)
    print(format_report(report))
    title = f"head {head_dir}" + (f" (w={args.weight_mismatch:g} undone)" if args.weight_mismatch != 1 else "")
    plot_reliability(report, args.plot_path, title=title)
    print(f"reliability diagram: {args.plot_path}")
    if head.alignment == "proposer" and all("candidates" in record for record in records):
        ranks = max(len(candidates) for record in records for candidates in record["candidates"])
        rank_labels, rank_predictions = predict(head, draft, records, batch_size=args.batch_size, num_candidates=ranks)
        report["by_rank"] = rank_report(rank_labels, unweight(rank_predictions, args.weight_mismatch), args.num_bins)
        print(format_rank_report(report["by_rank"]))
        plot_rank_reliability(report["by_rank"], args.rank_plot_path, title=title)
        print(f"reliability diagram by candidate rank: {args.rank_plot_path}")
    if args.choose_threshold:
        target = load_model(pair.target, **pair.loading())
        report["threshold"] = store_threshold(head, head_dir, draft, target, records, args, predictions)
    if args.output:
        with atomic_write(args.output) as f:
            json.dump(report, f, indent=2)
    return report


def store_threshold(head: AcceptancePredictionHead, head_dir: str, draft, target, records: list[dict],
                    args: CalibrationArguments, predictions: np.ndarray) -> dict:
    """Choose the head's threshold on `records`, store it in `head_dir`, plot the cost curve; return the selection."""
    times = stored_step_times(args.step_times_from) if args.step_times_from else None
    with torch_threads(args.threads):
        threshold, selection = choose_threshold(head, draft, target, records, tuple(args.bound),
                                                batch_size=args.batch_size, predictions=predictions, times=times,
                                                compile=args.compile)
    selection["data"] = args.records
    head.cpu().with_threshold(threshold, selection).save_pretrained(head_dir)
    plot_threshold_curve(selection, threshold, args.threshold_plot_path)
    best_k = min(selection["constant_k_cost_per_token"].items(), key=lambda kv: kv[1])
    dynamic = selection.get("dynamic_cost_per_token")
    best_dynamic = min(dynamic.items(), key=lambda kv: kv[1]) if dynamic else None
    online = selection.get("online_cost_per_token")
    best_online = min(online.items(), key=lambda kv: kv[1]) if online else None
    oracle = selection["oracle_cost_per_token"]
    flat = flat_costs(selection.get("calls_per_token") or {}, StepTimes(**selection["step_times"]))
    flat_text = f"; {FLAT_COST} {flat[f'ada@{threshold:g}']:.3f}" if f"ada@{threshold:g}" in flat else ""
    print(f"stop threshold {threshold:g}: replayed {MEASURED_COST} {min(selection['cost_per_token']):.3f}{flat_text} "
          f"({selection['mode']}; best constant K={best_k[0]}: {best_k[1]:.3f}"
          + (f"; best dynamic ({best_dynamic[0]}): {best_dynamic[1]:.3f}" if best_dynamic else "")
          + (f"; best online, vLLM's estimator ({best_online[0]}): {best_online[1]:.3f}" if best_online else "")
          + ("" if oracle is None else f"; oracle {oracle:.3f}")
          + f"); stored in {head_dir}/config.json; plot: {args.threshold_plot_path}")
    if best_dynamic and best_dynamic[1] < min(selection["cost_per_token"]):
        print(f"note: on these records and this machine our dynamic schedule (assistant_confidence_threshold="
              f"{best_dynamic[0]}) replays cheaper than this head at any threshold: its judgement costs more than "
              "its predictions save here")
    return {"stop_threshold": threshold, **selection}


def plot_threshold_curve(selection: dict, threshold: float, path: str) -> None:
    """Replayed cost per token against the stop threshold, with the best baselines and the oracle."""
    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.subplots()
    ax.plot(selection["thresholds"], selection["cost_per_token"], "o-", label="ada (this head)")
    best_k, best_cost = min(selection["constant_k_cost_per_token"].items(), key=lambda kv: kv[1])
    ax.axhline(best_cost, color="C1", linestyle="--", label=f"best constant K={best_k}")
    if selection.get("dynamic_cost_per_token"):
        confidence, dynamic_cost = min(selection["dynamic_cost_per_token"].items(), key=lambda kv: kv[1])
        ax.axhline(dynamic_cost, color="C3", linestyle="-.", label=f"best dynamic (confidence {confidence})")
    if selection.get("online_cost_per_token"):
        threshold_online, online_cost = min(selection["online_cost_per_token"].items(), key=lambda kv: kv[1])
        ax.axhline(online_cost, color="C4", linestyle=(0, (5, 2)), label=f"best online (threshold {threshold_online})")
    if selection["oracle_cost_per_token"] is not None:
        ax.axhline(selection["oracle_cost_per_token"], color="gray", linestyle=":", label="oracle")
    ax.axvline(threshold, color="C2", alpha=0.5, label=f"chosen {threshold:g}")
    ax.set(xlabel="stop threshold", ylabel=MEASURED_COST,
           title=f"replayed {REPLAYED_ROUNDS[selection.get('mode', 'greedy')].split(' (')[0]}, {selection['records']} records, bound {tuple(selection['bound'])}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


FLAGS = (HeadPairArguments, CalibrationArguments)


def main(argv: list[str] | None = None) -> None:
    """Command line: `python -m specdecpp.calibration.report --help`."""
    with input_errors("calibration"):
        pair, args = HfArgumentParser(FLAGS).parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
        run(pair, args)


if __name__ == "__main__":
    main()
