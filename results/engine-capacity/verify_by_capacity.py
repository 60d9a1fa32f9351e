"""Compiled verification and draft-step prices by engine capacity on one context of 150 tokens (two passes, 256 and
512 alternating): does attention read the whole static cache? From the repository root:

    python results/engine-capacity/verify_by_capacity.py    # verify_by_capacity.txt
"""
import statistics
import sys
import time

import torch
sys.path.insert(0, "benchmarks")
from harness import HEAD, load_pair, load_prompt_ids
from specdecpp.engine.decoding import step_models, verify
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.settings import DecodingSettings
from specdecpp.measuring.step_timing import loaded_models

torch.set_num_threads(1)
target, draft, head = load_pair(head=HEAD)
prompt = load_prompt_ids("stdlib-heldout", n_end=4)[3]
seq = torch.cat([prompt, prompt[:, :150 - prompt.shape[1]]], 1) if prompt.shape[1] < 150 else prompt[:, :150]
seq = seq[0].tolist()
processing = sampling_only(False)
for max_length in (171, 400, 171, 400):
    t, d = loaded_models(lambda: step_models(target, draft, DecodingSettings(compile=True), processing,
                                             max_length)[:2], seq)
    print("capacity", t.capacity if hasattr(t, "capacity") else "?", end=": ")
    with torch.inference_mode():
        for k in (0, 1, 3, 6):
            times = []
            for _ in range(40):
                start = time.perf_counter()
                verify(t, seq, seq[-1:] * k, [], processing, None)
                times.append(1000 * (time.perf_counter() - start))
                t.crop(len(seq) - 1)
            dt = []
            for _ in range(40):
                start = time.perf_counter()
                d.draft_step(seq, 1, None)
                dt.append(1000 * (time.perf_counter() - start))
                d.crop(len(seq) - 1)
            print(f"verify k={k} {statistics.median(times):.3f}", end="; ")
    print(f"draft step {statistics.median(dt):.3f}")
