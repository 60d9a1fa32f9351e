"""Compiled step prices by context length on one 256-token engine: probes on prefixes of one held-out generation
(40 to 230 tokens), interleaved, 8 passes each, medians (ms, one thread).

    python results/verify-steps/excess/context.py
"""
from zoo import continued, zoo

from specdecpp.measuring.step_timing import StepProbe

target, draft, _, (prompt,) = zoo(3, 4)
seq = continued(target, prompt, 200)
probes = {n: StepProbe(target, draft, seq[:, :n], 5, compile=True, max_length=256) for n in (40, 80, 120, 160, 200, 230)}
for _ in range(8):
    for probe in probes.values():
        probe.sample()
print("| context | target alone | verify k=0..5 | draft j=1..5 |")
print("| ---: | ---: | --- | --- |")
for n, probe in probes.items():
    t = probe.times()
    print(f"| {n} | {t.target_alone_ms:.3f} | " + " ".join(f"{v:.3f}" for v in t.verify_ms_measured) + " | "
          + " ".join(f"{v:.3f}" for v in t.draft_ms) + " |")
