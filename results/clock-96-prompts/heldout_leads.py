"""Each calibration report's AUROC, ECE, `ada` at its best threshold and the best `dynamic` (target-alone steps per
token) and `ada`'s lead over it.

    python results/clock-96-prompts/heldout_leads.py results/clock-96-prompts/heldout-100-250-*.json
"""
import json
import sys

for path in sys.argv[1:]:
    report = json.load(open(path))
    selection = report["threshold"]
    costs, thresholds = selection["cost_per_token"], selection["thresholds"]
    best = min(range(len(costs)), key=costs.__getitem__)
    dynamic = selection["dynamic_cost_per_token"]
    dynamic = min(dynamic.values()) if isinstance(dynamic, dict) else min(dynamic)
    print(f"{path}: AUROC {report['auroc']:.4f}, ECE {report['ece']:.4f}, ada {costs[best]:.4f} at {thresholds[best]}, "
          f"best dynamic {dynamic:.4f}, ada {100 * (costs[best] / dynamic - 1):+.1f}%")
