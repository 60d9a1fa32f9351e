"""Compiled step prices by context length on one 256-token engine: probes on prefixes of one held-out generation
(40 to 230 tokens), interleaved, 8 passes each, medians (ms, one thread).

    python results/verify-steps/excess/context.py
"""
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
seq = speculative_generate(target, None, prompt, max_new_tokens=200, eos_token_id=[]).sequences
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
