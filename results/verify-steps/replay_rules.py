"""The zoo head's dev records replayed at its stored compiled step times, each verification priced by the line fit
(before `ca1fe76`) and by each length's median: `dynamic`, constant K, the product rule (`ada`) and the cost-aware
rule scaled by the marginal cost of one more token from the Theil-Sen slope (the calibration's) and from each
length's own price. From the repository root:

    python results/verify-steps/replay_rules.py
"""
import subprocess
import sys
from dataclasses import replace
from types import ModuleType

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from specdecpp import AcceptancePredictionHead
from specdecpp.calibration import threshold as T
from specdecpp.costs import StepTimes, fit_verify_ms
from specdecpp.data.io import read_records
from specdecpp.head.inputs import predict

line_fit = ModuleType("line_fit")  # the pricing before ca1fe76
sys.modules["line_fit"] = line_fit
exec(subprocess.run(["git", "show", "ca1fe76~1:specdecpp/costs.py"], capture_output=True, text=True, check=True).stdout,
     line_fit.__dict__)
torch.set_num_threads(1)
head = AcceptancePredictionHead.from_pretrained("checkpoints/zoo/head")
draft = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/draft").eval()
records = read_records("data/generated/stdlib-train-dev.jsonl")
flat = predict(head, draft, records, batch_size=8)[1]
bounds = np.cumsum([0] + [len(r["p_acc"]) for r in records])
predictions = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
accept = [np.asarray(r["p_acc"], dtype=np.float64) for r in records]
draft_probs = [np.exp(np.asarray(r["log_p_draft"], dtype=np.float64)) for r in records]
selection = head.threshold_selection
stored = {kind: StepTimes(**selection[kind]) for kind in ("step_times", "judged_step_times")}
print("| verification prices | best dynamic | best K | ada (threshold) | cost-aware, slope | cost-aware, per length "
      "| best dynamic over ada |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for name, fit in (("line fit", line_fit.fit_verify_ms), ("each length's median", fit_verify_ms)):
    plain, judged = (replace(t, verify_ms=fit(t.verify_ms_measured)) for t in stored.values())

    def cost(length, times, values=predictions, is_judged=False):
        return T.replay(accept, values, length, 20, times, is_judged, plain.target_alone_ms)["cost_per_token"]

    dynamic = min(cost(T.dynamic_length(c), plain, draft_probs) for c in (0.3, 0.35, 0.4, 0.45, 0.5))
    constant = min(cost(T.constant_length(k), plain) for k in range(1, 7))
    ada = {t: cost(T.ada_length(t, 1), judged, is_judged=True) for t in T.THRESHOLDS}
    v = judged.verify_ms
    marginal = [judged.draft_ms[min(j, 19)] + judged.judge_ms + max(v[min(j + 1, 20)] - v[j], 0.0) for j in range(1, 21)]
    scales = {"slope": T.marginal_scale(judged, 20), "length": [m / marginal[0] for m in marginal]}
    aware = {kind: min(cost(T.ada_length(t, 1, scale), judged, is_judged=True) for t in T.THRESHOLDS)
             for kind, scale in scales.items()}
    best = min(ada, key=ada.get)
    print(f"| {name} | {dynamic:.4f} | {constant:.4f} | {ada[best]:.4f} ({best}) | {aware['slope']:.4f} | "
          f"{aware['length']:.4f} | {dynamic / ada[best]:.3f}x |")
