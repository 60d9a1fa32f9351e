"""`ada`'s prediction with its verifications priced by the plain probe, as `dynamic`'s are: the two probes time the
same verifications (no judgement in them), so their ratio is the probes' noise. From `time_breakdown.py`'s JSON:

    python results/cpu-per-machine/same_probe.py results/cpu-per-machine/run*.json
"""
import json
import statistics
import sys

for path in sys.argv[1:]:
    result = json.load(open(path))
    for engine, plain in result["step_times"].items():
        judged = result["judged_step_times"][engine]
        ratio = statistics.median(b / a for a, b in zip(plain["verify_ms"][1:], judged["verify_ms"][1:]))
        rows = {row["method"]: row for row in result["rows"] if row["engine"] == engine}
        fastest = min((row for name, row in rows.items() if name.startswith("dynamic@")),
                      key=lambda row: row["measured_ms_per_token"])
        for name in ("ada@auto", *[n for n in rows if n.startswith("ada@") and n != "ada@auto"]):
            ada = rows[name]
            repriced = ada["predicted_ms_per_token"] + ada["predicted_verify_ms_per_token"] * (1 / ratio - 1)
            print(f"{path} {engine} {name}: judged/plain probe verifications {ratio:.3f}; "
                  f"over {fastest['method']} measured {fastest['measured_ms_per_token'] / ada['measured_ms_per_token']:.3f}x, "
                  f"predicted {fastest['predicted_ms_per_token'] / ada['predicted_ms_per_token']:.3f}x, "
                  f"predicted at the plain probe's verifications {fastest['predicted_ms_per_token'] / repriced:.3f}x")
