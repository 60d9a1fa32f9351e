"""Every stored time breakdown priced again with today's `fit_verify_ms` (each length's median, one outlier
ignored) instead of the line it was priced with: measured/predicted per method, and their spread over the methods
(constant K, `dynamic`, `ada`; the target alone and the oracle left out). From the repository root:

    python results/verify-steps/reprice.py results/eager-split/run*.json results/zoo-head-retrained/run*.json
"""
import json
import sys

from specdecpp.costs import fit_verify_ms

print("| run | engine | K=2 | K=3 | K=4 | dynamic@0.4 | ada@auto | spread over methods |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for path in sys.argv[1:]:
    data = json.load(open(path))
    for engine in data["step_times"]:
        ratios = {}
        for row in data["rows"]:
            if row["engine"] != engine or row["method"] in ("target alone", "oracle"):
                continue
            times = data["judged_step_times" if row["method"].startswith("ada") else "step_times"][engine]
            old, new = times["verify_ms"], fit_verify_ms(times["verify_ms_measured"])
            rounds = {int(k): n for k, n in row["rounds_by_draft_length"].items()}
            tokens = sum(rounds.values()) / row["target_calls_per_token"]
            change = sum(n * (new[min(k, len(new) - 1)] - old[min(k, len(old) - 1)]) for k, n in rounds.items())
            predicted = row["predicted_ms_per_token"]
            ratios[row["method"]] = (row["measured_ms_per_token"] / predicted,
                                     row["measured_ms_per_token"] / (predicted + change / tokens))
        cells = [f"{ratios[m][0]:.3f} → {ratios[m][1]:.3f}" if m in ratios else "-"
                 for m in ("constant K=2", "constant K=3", "constant K=4", "dynamic@0.4", "ada@auto")]
        spreads = [max(r[i] for r in ratios.values()) - min(r[i] for r in ratios.values()) for i in (0, 1)]
        print(f"| {path.removeprefix('results/')} | {engine} | " + " | ".join(cells)
              + f" | {spreads[0]:.3f} → {spreads[1]:.3f} |")
