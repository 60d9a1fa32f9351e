"""Mean over median of a compiled step probe's samples (40 passes on one held-out context): how much the probe's
medians leave out of a sum of steps (one thread).

    python results/verify-steps/excess/tails.py
"""
import statistics

from zoo import continued, zoo

from specdecpp.measuring.step_timing import StepProbe

target, draft, _, (prompt,) = zoo(3, 4)
context = continued(target, prompt, 64)
probe = StepProbe(target, draft, context, 8, compile=True)
for _ in range(40):
    probe.sample()


def ratio(samples: list[float]) -> str:
    return f"{statistics.mean(samples) / statistics.median(samples):.3f}"


print("target alone", ratio(probe.alone))
print("verify k=0..8", " ".join(ratio(v) for v in probe.verified))
print("draft step j=1..8", " ".join(ratio(v) for v in probe.drafts))
