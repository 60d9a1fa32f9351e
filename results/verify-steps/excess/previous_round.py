"""Compiled rounds on one context (a 256-token engine): the verification of 2 drafted tokens right after a round of
another length (0: a target-alone step), each pair repeated in turn, 30 times. Medians, ms.

    python results/verify-steps/excess/previous_round.py
"""
import statistics
from collections import defaultdict

import torch
from zoo import continued, round_ms, zoo

from specdecpp.engine.decoding import step_models
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.settings import DecodingSettings
from specdecpp.measuring.step_timing import loaded_models

target, draft, head, prompts = zoo(0, 6)
seq, processing = continued(target, prompts[3], 64)[0].tolist(), sampling_only(False)
target_model, draft_model = loaded_models(
    lambda: step_models(target, draft, DecodingSettings(compile=True), processing, 256)[:2], seq)


previous = (0, 1, 2, 3, 5, 10, 20)
times = defaultdict(list)
with torch.inference_mode():
    for _ in range(30):
        for k in previous:
            for _ in range(3):
                round_ms(target_model, draft_model, seq, k)
                times[k].append(round_ms(target_model, draft_model, seq, 2))
print("| previous round's drafted tokens | " + " | ".join(map(str, previous)) + " |")
print("| --- |" + " ---: |" * len(previous))
print("| verifying 2 drafted tokens after it (ms) | "
      + " | ".join(f"{statistics.median(times[k]):.2f}" for k in previous) + " |")
