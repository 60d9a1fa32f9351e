"""The compiled target's verifications of 0-8 drafted tokens, back to back on one context (a 256-token engine), with
inductor's default settings or with `freezing` (weights as constants, prepacked for oneDNN); medians of 40 passes.

    python results/verify-steps/excess/freezing.py            # and --freeze, in another process
"""
import statistics
import sys
import time

import torch
from zoo import continued, zoo

from specdecpp.engine.compiled import StaticModel

torch._inductor.config.freezing = "--freeze" in sys.argv
target, _, _, prompts = zoo(0, 6)
seq = continued(target, prompts[3], 64)[0].tolist()
times = {k: [] for k in range(9)}
with torch.inference_mode():
    engine = StaticModel(target, 256)
    engine.warm_up()
    engine.logits(seq, num_logits=1)
    for timed in [False] * 3 + [True] * 40:
        for k in range(9):
            engine.crop(len(seq) - 1)
            start = time.perf_counter()
            engine.logits(seq + [5] * k, num_logits=k + 1)
            if timed:
                times[k].append(1000 * (time.perf_counter() - start))
print(f"{'freezing' if torch._inductor.config.freezing else 'default'}: verify k=0..8 (ms) "
      + " ".join(f"{statistics.median(v):.2f}" for v in times.values()))
