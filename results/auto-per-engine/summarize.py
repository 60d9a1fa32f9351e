"""`ada@auto` against the fastest `dynamic` of the same run, per engine, from `time_breakdown.py --output_json` files:
measured and as the counts predict, and the judged draft step's price over the plain one (median of steps 5 to 20)."""
import json
import statistics
import sys
from pathlib import Path

print("| run | engine | ada@auto threshold | ada@auto ms/tok | fastest dynamic | its ms/tok | ada tokens/s over it, "
      "measured | predicted (fastest dynamic by prediction) | judged / plain draft step (j = 5..20) |")
print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
for path in sorted(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent).glob("run*.json")):
    result = json.loads(path.read_text())
    for engine in result["step_times"]:
        rows = {row["method"]: row for row in result["rows"] if row["engine"] == engine}
        ada = rows["ada@auto"]
        best = min((row for name, row in rows.items() if name.startswith("dynamic@")),
                   key=lambda row: row["measured_ms_per_token"])
        predicted_best = min(row["predicted_ms_per_token"] for name, row in rows.items() if name.startswith("dynamic@"))
        plain, judged = (statistics.median(times["draft_ms"][4:20])
                         for times in (result["step_times"][engine], result["judged_step_times"][engine]))
        print(f"| {path.stem} | {engine} | {ada['stop_threshold']:g} | {ada['measured_ms_per_token']:.3f} | "
              f"{best['method']} | {best['measured_ms_per_token']:.3f} | "
              f"{best['measured_ms_per_token'] / ada['measured_ms_per_token']:.3f}x | "
              f"{predicted_best / ada['predicted_ms_per_token']:.3f}x | {judged / plain:.3f}x |")
