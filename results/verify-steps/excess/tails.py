"""Mean over median of a compiled step probe's samples (40 passes on one held-out context): how much the probe's
medians leave out of a sum of steps (one thread).

    python results/verify-steps/excess/tails.py
"""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from harness import HEAD, load_pair, load_prompt_ids  # noqa: E402

from specdecpp import speculative_generate  # noqa: E402
from specdecpp.measuring.step_timing import StepProbe  # noqa: E402

torch.set_num_threads(1)
target, draft, _ = load_pair(head=HEAD)
prompt = load_prompt_ids("stdlib-heldout", n_begin=3, n_end=4)[0]
context = speculative_generate(target, None, prompt, max_new_tokens=64, eos_token_id=[]).sequences
probe = StepProbe(target, draft, context, 8, compile=True)
for _ in range(40):
    probe.sample()


def ratio(samples: list[float]) -> str:
    return f"{statistics.mean(samples) / statistics.median(samples):.3f}"


print("target alone", ratio(probe.alone))
print("verify k=0..8", " ".join(ratio(v) for v in probe.verified))
print("draft step j=1..8", " ".join(ratio(v) for v in probe.drafts))
