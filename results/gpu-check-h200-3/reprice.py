"""Price the GPU checks' compiled rounds again with today's `fit_verify_ms`: constant K's predicted
ms/token (every round verifies K tokens, so its price moves by target calls x the change at K), and
what `stop_threshold="auto"` chooses for the zoo head at each run's compiled step times; and, for
comparison, at this CPU's (the head's calibration and `results/compiled-guards/`' runs).

    python results/gpu-check-h200-3/reprice.py
"""
import json
from dataclasses import replace
from pathlib import Path

from specdecpp import AcceptancePredictionHead
from specdecpp.costs import StepTimes, fit_verify_ms

RESULTS = Path(__file__).resolve().parent.parent
RUNS = ("gpu-check-h200-1", "gpu-check-h200-2", "gpu-check-h200-3")


def main() -> None:
    head = AcceptancePredictionHead.from_pretrained(str(RESULTS.parent / "checkpoints" / "zoo" / "head"))
    print("| run | method | measured ms/tok | predicted, line | ratio | predicted, per length | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    choices = []
    for run in RUNS:
        result = json.loads((RESULTS / run / "zoo-float32.json").read_text())
        plain = result["step_times"]["compiled"]
        old, new = plain["verify_ms"], fit_verify_ms(plain["verify_ms_measured"])
        for row in result["rows"]:
            if row["engine"] == "compiled" and row["method"].startswith("constant"):
                k = int(row["method"].split("=")[1])
                predicted = row["predicted_ms_per_token"] - row["target_calls_per_token"] * (old[k] - new[k])
                print(f"| {run} | {row['method']} | {row['measured_ms_per_token']:.3f} | "
                      f"{row['predicted_ms_per_token']:.3f} | {row['ratio']:.3f} | {predicted:.3f} | "
                      f"{row['measured_ms_per_token'] / predicted:.3f} |")
        judged = StepTimes(**(result.get("device_step_times") or result["judged_step_times"]["compiled"]))
        repriced = replace(judged, verify_ms=fit_verify_ms(judged.verify_ms_measured))
        choices.append(f"| {run} | {head.threshold_for(judged)} | {head.threshold_for(repriced)} |")
    cpu = [("calibration", head.threshold_selection["judged_step_times"])]
    cpu += [(path.stem, json.loads(path.read_text())["judged_step_times"]["compiled"])
            for path in sorted((RESULTS / "compiled-guards").glob("time_breakdown_*.json"))]
    for name, times in cpu:
        judged = StepTimes(**times)
        repriced = replace(judged, verify_ms=fit_verify_ms(judged.verify_ms_measured))
        choices.append(f"| cpu: {name} | {head.threshold_for(judged)} | {head.threshold_for(repriced)} |")
    print("\n| run | `auto`, line | `auto`, per length |\n| --- | ---: | ---: |\n" + "\n".join(choices))


if __name__ == "__main__":
    main()
