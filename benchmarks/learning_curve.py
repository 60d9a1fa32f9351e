"""Tabulate the heads of `benchmarks/learning_curve.sh`: for each input set and number of training
records, the dev calibration (AUROC, ECE, binary KL) and the replayed cost per token (target-alone
steps, this machine's measured step times) at the stored threshold, with the cost-aware rule at its
best threshold, against the best `dynamic` and constant K replayed from the same timings; then the
same replays counted as the evaluation tables count them (flat verification).

    python benchmarks/learning_curve.py [outputs/curve]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from specdecpp.costs import FLAT_COST, FLAT_UNIT, MEASURED_COST, StepTimes, flat_costs


def rows(folder: Path) -> list[dict]:
    """One row per head folder holding a `calibration.json`, ordered by input set then size."""
    found = []
    for path in folder.glob("*/calibration.json"):
        name, _, size = path.parent.name.rpartition("-")
        report = json.loads(path.read_text())
        selection = report["threshold"]
        calls = selection["calls_per_token"]
        times = selection["step_times"]
        flat = flat_costs(calls, StepTimes(**times))
        found.append({"set": name, "records": int(size), "auroc": report["auroc"], "ece": report["ece"],
                      "flat_auto": flat[f"ada@{selection['stop_threshold']:g}"],
                      "flat_best": min(v for m, v in flat.items() if m.startswith("ada@")),
                      "flat_dynamic": min(v for m, v in flat.items() if m.startswith("dynamic@")),
                      "flat_constant": min(v for m, v in flat.items() if m.startswith("K=")),
                      "binary_kl": report["binary_kl"], "threshold": selection["stop_threshold"],
                      "product": min(selection["cost_per_token"]),
                      "marginal": min(selection.get("marginal_cost_per_token") or [float("nan")]),
                      "dynamic": min(selection["dynamic_cost_per_token"].values()),
                      "constant": min(selection["constant_k_cost_per_token"].values()),
                      "oracle": selection["oracle_cost_per_token"]})
    return sorted(found, key=lambda r: (r["set"], r["records"]))


def table(found: list[dict]) -> str:
    """The rows as a markdown table, with the head's cost relative to the best dynamic and K."""
    lines = [f"| inputs | records | AUROC | ECE | binary KL | auto | {MEASURED_COST} at auto | cost-aware rule (best) "
             "| best dynamic | best K | oracle | vs dynamic | vs K |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in found:
        lines.append(f"| {r['set']} | {r['records']} | {r['auroc']:.4f} | {r['ece']:.4f} | {r['binary_kl']:.4f} "
                     f"| {r['threshold']:g} | {r['product']:.4f} | {r['marginal']:.4f} | {r['dynamic']:.4f} "
                     f"| {r['constant']:.4f} | {r['oracle']:.4f} | {100 * (r['product'] / r['dynamic'] - 1):+.1f}% "
                     f"| {100 * (r['product'] / r['constant'] - 1):+.1f}% |")
    lines += ["", f"Flat view, as the evaluation tables count ({FLAT_UNIT}):", "",
              f"| inputs | records | {FLAT_COST} at auto | best threshold | best dynamic | best K | auto vs dynamic "
              "| auto vs K |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in found:
        lines.append(f"| {r['set']} | {r['records']} | {r['flat_auto']:.4f} | {r['flat_best']:.4f} "
                     f"| {r['flat_dynamic']:.4f} | {r['flat_constant']:.4f} "
                     f"| {100 * (r['flat_auto'] / r['flat_dynamic'] - 1):+.1f}% "
                     f"| {100 * (r['flat_auto'] / r['flat_constant'] - 1):+.1f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(rows(Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/curve"))))
