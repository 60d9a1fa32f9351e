"""Tables of the before/after time_breakdown runs in this folder: `python summarize.py .`"""
import json, statistics, sys
R = (1, 2, 3, 4)
from pathlib import Path
folder = Path(sys.argv[1])
runs = {(tree, r): json.loads((folder / f"time_breakdown_{tree}{r}.json").read_text()) for tree in ("before", "after") for r in (1, 2, 3, 4)}
def rows(d): return {(x["engine"], x["method"]): x for x in d["rows"]}
out = []
out.append("| engine | method | ms/token before (runs 1-4) | after (runs 1-4) | speedup over target alone before | after | after / before (speedup, means) | target calls/tok before, after | draft calls/tok before, after |")
out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
ratios = {"eager": [], "compiled": []}
for key in rows(runs["before", 1]):
    ms = {t: [rows(runs[t, r])[key]["measured_ms_per_token"] for r in R] for t in ("before", "after")}
    sp = {t: [rows(runs[t, r])[("" if False else key[0], "target alone")]["measured_ms_per_token"] / rows(runs[t, r])[key]["measured_ms_per_token"] for r in R] for t in ("before", "after")}
    ratio = statistics.mean(sp["after"]) / statistics.mean(sp["before"])
    if key[1] != "target alone":
        ratios[key[0]].append(ratio)
    calls = lambda f: ", ".join(f"{rows(runs[t, 1])[key][f]:.3f}" for t in ("before", "after"))
    out.append(f"| {key[0]} | {key[1]} | {', '.join(f'{v:.2f}' for v in ms['before'])} | {', '.join(f'{v:.2f}' for v in ms['after'])} | "
               f"{', '.join(f'{v:.2f}x' for v in sp['before'])} | {', '.join(f'{v:.2f}x' for v in sp['after'])} | {ratio:.3f} | "
               f"{calls('target_calls_per_token')} | {calls('draft_calls_per_token')} |")
for e, r in ratios.items():
    out.append(f"\n{e}: after / before speedup, median {statistics.median(r):.3f}, range {min(r):.3f}-{max(r):.3f}")
out.append("\n| tree, run | engine | draft step j=5..20, median ms: plain | ada's (judged) | ada / plain | judgement outside the step, ms | ada@auto / best dynamic, ms/tok measured | predicted by the counts |")
out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for (t, r), d in runs.items():
    for e in ("eager", "compiled"):
        plain = statistics.median(d["step_times"][e]["draft_ms"][4:])
        judged_t = d["judged_step_times"][e]
        judged = statistics.median(judged_t["draft_ms"][4:])
        judge = judged_t.get("judge_ms", 0.0)
        rw = rows(d)
        best = {f: min(rw[e, m][f] for (en, m) in rw if en == e and m.startswith("dynamic"))
                for f in ("measured_ms_per_token", "predicted_ms_per_token")}
        ada = {f: rw[e, "ada@auto"][f] / best[f] for f in best}
        out.append(f"| {t} {r} | {e} | {plain:.3f} | {judged:.3f} + {judge:.3f} | {(judged + judge) / plain:.3f} | "
                   f"{judge:.3f} | {ada['measured_ms_per_token']:.3f} | {ada['predicted_ms_per_token']:.3f} |")
print("\n".join(out))
