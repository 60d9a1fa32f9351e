"""The zoo draft's step after one, two or three tokens it has not seen (the step after a round accepted whole
feeds two), and a later step of a round, both engines, plain and judged; medians of 300 (ms, one thread).

    python results/gpu-check-h200-5/catch_up.py
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from harness import HEAD, load_pair, load_prompt_ids  # noqa: E402

from specdecpp import speculative_generate  # noqa: E402
from specdecpp.engine.decoding import step_models  # noqa: E402
from specdecpp.engine.processing import sampling_only  # noqa: E402
from specdecpp.engine.settings import DecodingSettings  # noqa: E402

torch.set_num_threads(1)
target, draft, head = load_pair(head=HEAD)
prompt = load_prompt_ids("stdlib-heldout", n_begin=3, n_end=4)[0]
seq = speculative_generate(target, None, prompt, max_new_tokens=64, eos_token_id=[]).sequences[0].tolist()
print("| engine | one new token | two | three | a later step of a round |")
for compile in (False, True):
    for judging in (None, head):
        settings = DecodingSettings(schedule="ada" if judging else "constant", head=judging, compile=compile)
        _, model, _ = step_models(target, draft, settings, sampling_only(False), len(seq) + 22)
        new = {1: [], 2: [], 3: []}
        later = []
        with torch.inference_mode():
            model.draft_step(seq[:-1], 1, None)
            for _ in range(300):
                for n in new:
                    model.crop(len(seq) - n)
                    start = time.perf_counter()
                    model.draft_step(seq, 1, None)
                    new[n].append(1000 * (time.perf_counter() - start))
            for _ in range(300):
                model.crop(len(seq) - 1)
                model.draft_step(seq, 1, None)
                start = time.perf_counter()
                model.draft_step(seq + seq[-1:], 2, None)
                later.append(1000 * (time.perf_counter() - start))
        name = f"{'compiled' if compile else 'eager'}, {'judged' if judging else 'plain'}"
        print(f"| {name} | " + " | ".join(f"{statistics.median(v):.3f}" for v in [*new.values(), later]) + " |")
