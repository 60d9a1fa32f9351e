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

`--choose_threshold --target TARGET` also picks the head's stop threshold for `stop_threshold="auto"`
(`specdecpp.threshold`): rounds on the records (greedy or sampled, as the head will decode) are
replayed with the head's predictions and priced with the pair's measured step times; the threshold, the times and the cost curve go into
the head folder's `config.json` and model card, and the curve into `--threshold_plot_path`.
"""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import HfArgumentParser

from specdecpp.cli import input_errors
from specdecpp.data_io import atomic_write, read_records
from specdecpp.head import AcceptancePredictionHead
from specdecpp.head_data import predict
from specdecpp.models import ModelLoadingArguments, load_head, load_model
from specdecpp.threshold import choose_threshold, stored_step_times
from specdecpp.train import binary_kl, check_data_fits_draft


@dataclass
class CalibrationArguments:
    head: str = field(metadata={"aliases": ["--head_name_or_path"], "help": "the trained head: a folder or a Hub id"})
    draft: str = field(metadata={
        "aliases": ["--draft_name_or_path"], "help": "the draft model the head was trained on"})
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
    choose_threshold: bool = field(default=False, metadata={"help": (
        "also choose the head's stop threshold by replaying rounds on these records (greedy, or expected over "
        "p_acc for sampled records: choose on data of the mode you decode in) with the pair's measured costs "
        "(needs --target and a proposer head), and store it in the head folder")})
    target: str | None = field(default=None, metadata={
        "aliases": ["--target_name_or_path"], "help": "the target model (for --choose_threshold)"})
    bound: list[int] = field(default_factory=lambda: [2, 20], metadata={
        "help": "ada's MIN MAX drafted tokens per round, as decoding will use them (for --choose_threshold)"})
    threshold_plot_path: str = field(default="threshold.png", metadata={
        "help": "where the replayed cost-against-threshold plot goes (for --choose_threshold)"})
    step_times_from: str | None = field(default=None, metadata={"help": (
        "a head folder (or a calibration --output_json file) whose threshold selection holds step times measured "
        "earlier (say, on a quiet "
        "machine): --choose_threshold replays with those instead of timing the pair now, so that heads "
        "compared side by side are priced alike")})

    def __post_init__(self):
        if self.num_bins < 1 or self.batch_size < 1:
            raise ValueError(f"num_bins and batch_size must be >= 1, got {self.num_bins}, {self.batch_size}")
        if self.weight_mismatch <= 0:
            raise ValueError(f"weight_mismatch must be > 0, got {self.weight_mismatch}")
        if not 0 <= self.mixing_ratio < 1:
            raise ValueError(f"mixing_ratio must be in [0, 1), got {self.mixing_ratio}")
        if self.choose_threshold and not (self.target and os.path.isdir(self.head)):
            raise ValueError("--choose_threshold needs --target (its verification times price the rounds) and a "
                             "local --head folder to store the threshold in")
        if len(self.bound) != 2 or not 1 <= self.bound[0] <= self.bound[1]:
            raise ValueError(f"--bound takes MIN MAX with 1 <= MIN <= MAX, got {self.bound}")


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


def check_outputs(args: CalibrationArguments) -> None:
    """Refuse an output file in a folder that does not exist (FileNotFoundError) before anything is
    read or scored, rather than after the whole report was computed."""
    outputs = {"--plot_path": args.plot_path, "--output_json": args.output_json}
    if args.choose_threshold:
        outputs["--threshold_plot_path"] = args.threshold_plot_path
    for flag, path in outputs.items():
        if path and not os.path.isdir(folder := os.path.dirname(os.path.abspath(path))):
            raise FileNotFoundError(f"{flag} {path}: no folder {folder}; create it or choose another path")


def run(args: CalibrationArguments, loading: ModelLoadingArguments | None = None) -> dict:
    """Score the records, print the report, write the diagram (and JSON); returns the report."""
    loading = loading or ModelLoadingArguments()
    check_outputs(args)
    records = read_records(args.data_path)  # bad data fails before any model loads
    head = load_head(args.head)
    if args.choose_threshold and head.alignment != "proposer":  # refused now, not after scoring every record
        raise ValueError(f"--choose_threshold needs a proposer head, and {args.head} is a {head.alignment} head: "
                         "choosing a threshold replays rounds from the head's predictions on the records, which "
                         "hold the states a proposer head judges only (train one with --head_alignment proposer)")
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
    if args.choose_threshold:
        target = load_model(args.target, loading.torch_dtype, loading.device_map, loading.trust_remote_code)
        report["threshold"] = store_threshold(head, draft, target, records, args, predictions)
    if args.output_json:
        with atomic_write(args.output_json) as f:
            json.dump(report, f, indent=2)
    return report


def store_threshold(head: AcceptancePredictionHead, draft, target, records: list[dict],
                    args: CalibrationArguments, predictions: np.ndarray) -> dict:
    """Choose the head's threshold on `records` (`specdecpp.threshold.choose_threshold`) from its
    raw `predictions` over them (a proposer head's positions do not depend on the mixing ratio),
    store it in the head folder's config and card, plot the cost curve; returns the selection record."""
    times = stored_step_times(args.step_times_from) if args.step_times_from else None
    threshold, selection = choose_threshold(head, draft, target, records, tuple(args.bound), batch_size=args.batch_size,
                                            predictions=predictions, times=times)
    selection["data"] = args.data_path
    head.cpu().with_threshold(threshold, selection).save_pretrained(args.head)
    plot_threshold_curve(selection, threshold, args.threshold_plot_path)
    write_threshold_card(os.path.join(args.head, "README.md"), threshold, selection)
    best_k = min(selection["constant_k_cost_per_token"].items(), key=lambda kv: kv[1])
    dynamic = selection.get("dynamic_cost_per_token")
    best_dynamic = min(dynamic.items(), key=lambda kv: kv[1]) if dynamic else None
    print(f"stop threshold {threshold:g}: replayed cost per token {min(selection['cost_per_token']):.3f} target "
          f"steps ({selection['mode']}; best constant K={best_k[0]}: {best_k[1]:.3f}"
          + (f"; best dynamic ({best_dynamic[0]}): {best_dynamic[1]:.3f}" if best_dynamic else "")
          + f"{oracle_text(selection)}); stored in {args.head}/config.json; plot: {args.threshold_plot_path}")
    if best_dynamic and best_dynamic[1] < min(selection["cost_per_token"]):
        print(f"note: on these records and this machine our dynamic schedule (assistant_confidence_threshold="
              f"{best_dynamic[0]}) replays cheaper than this head at any threshold: its judgement costs more than "
              "its predictions save here")
    return {"stop_threshold": threshold, **selection}


def oracle_text(selection: dict) -> str:
    """`; oracle X` for a greedy selection, nothing for a sampled one (no oracle there)."""
    oracle = selection["oracle_cost_per_token"]
    return "" if oracle is None else f"; oracle {oracle:.3f}"


def plot_threshold_curve(selection: dict, threshold: float, path: str) -> None:
    """Replayed cost per token against the stop threshold, with the best constant K and the oracle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(selection["thresholds"], selection["cost_per_token"], "o-", label="ada (this head)")
    best_k, best_cost = min(selection["constant_k_cost_per_token"].items(), key=lambda kv: kv[1])
    ax.axhline(best_cost, color="C1", linestyle="--", label=f"best constant K={best_k}")
    if selection.get("dynamic_cost_per_token"):
        confidence, dynamic_cost = min(selection["dynamic_cost_per_token"].items(), key=lambda kv: kv[1])
        ax.axhline(dynamic_cost, color="C3", linestyle="-.", label=f"best dynamic (confidence {confidence})")
    if selection["oracle_cost_per_token"] is not None:
        ax.axhline(selection["oracle_cost_per_token"], color="gray", linestyle=":", label="oracle")
    ax.axvline(threshold, color="C2", alpha=0.5, label=f"chosen {threshold:g}")
    ax.set(xlabel="stop threshold", ylabel="cost per token (target-alone steps)",
           title=f"replayed {REPLAYED_ROUNDS[selection.get('mode', 'greedy')].split(' (')[0]}, {selection['records']} records, bound {tuple(selection['bound'])}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


THRESHOLD_SECTION = "## Stored stop threshold"
# The decoding settings in the card's usage examples (see head.MODEL_CARD), up to the call's ")".
USAGE_SETTINGS = re.compile(r"stop_threshold=[^,\n]+, bound=\(\d+, \d+\)(, do_sample=True)?\)")
REPLAYED_ROUNDS = {"greedy": "greedy rounds", "sampling": "sampled rounds (in expectation over p_acc)"}


def write_threshold_card(readme: str, threshold: float, selection: dict) -> None:
    """Add (or replace) the model card's section on the stored threshold and how it was chosen,
    keeping the sections around it, and point the card's usage examples at the stored threshold
    (`stop_threshold="auto"`, its bound and, when chosen on sampled records, `do_sample=True`)."""
    text = open(readme, encoding="utf-8").read() if os.path.isfile(readme) else ""
    before, _, after = text.partition(THRESHOLD_SECTION)
    later_sections = after[after.index("\n## "):] if "\n## " in after else ""
    sampling = ", do_sample=True" if selection.get("mode") == "sampling" else ""
    usage = f'stop_threshold="auto", bound={tuple(selection["bound"])}{sampling})'
    rows = "\n".join(f"| {t:g} | {c:.3f} |" for t, c in zip(selection["thresholds"], selection["cost_per_token"]))
    constant = ", ".join(f"K={k} {c:.3f}" for k, c in selection["constant_k_cost_per_token"].items())
    dynamic = selection.get("dynamic_cost_per_token")
    if dynamic:
        constant += "; our dynamic (draft confidence): " + ", ".join(f"{c} {v:.3f}" for c, v in dynamic.items())
    plain, judged = selection["step_times"], selection["judged_step_times"]
    section = f"""{THRESHOLD_SECTION}

`stop_threshold="auto"` uses **{threshold:g}**, chosen by replaying {REPLAYED_ROUNDS[selection.get('mode', 'greedy')]} on {selection['records']} dev
records ({selection['data']}, {selection['tokens']} tokens) with bound {tuple(selection['bound'])}, each round priced with
what the loop spends (`specdecpp.costs`), measured through the engine's own steps on {plain['device']} with
{plain['threads']} torch thread(s), {plain['repeats']} timed passes: a target-alone step {plain['target_alone_ms']:.2f} ms; a draft step
{plain['draft_ms'][0]:.2f} ms first in a round, {plain['draft_ms'][-1]:.2f} ms late in a long one ({judged['draft_ms'][0]:.2f} / {judged['draft_ms'][-1]:.2f} ms
with this head judging); the head's judgement {judged['judge_ms']:.3f} ms per drafted token; a verification of 1 / {len(plain['verify_ms']) - 1}
drafted tokens {plain['verify_ms'][1]:.2f} / {plain['verify_ms'][-1]:.2f} ms; the loop's own overhead {plain['round_overhead_ms']:.3f} ms per round.
Cost per token in target-alone steps (1 / cost is the replayed speedup); constant K: {constant}{oracle_text(selection)}.
Timings depend on the machine and its load: re-run `--choose_threshold` on the machine you decode on.

| threshold | cost per token |
| --- | --- |
{rows}
"""
    text = before.rstrip() + "\n\n" + section + later_sections
    with open(readme, "w", encoding="utf-8") as f:
        f.write(USAGE_SETTINGS.sub(usage, text))


def main(argv: list[str] | None = None) -> None:
    """Command line: `python -m specdecpp.calibration --help`."""
    parser = HfArgumentParser((CalibrationArguments, ModelLoadingArguments))
    with input_errors("calibration"):
        args, loading = parser.parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
        run(args, loading)


if __name__ == "__main__":
    main()
