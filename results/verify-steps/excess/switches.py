"""Two process-wide switches against the compiled verifications' excess: flushing denormals to zero
(`torch.set_flush_denormal`) and Python's garbage collector (off, with a long-lived heap of 300,000 objects as a
benchmark's results make one). `dynamic`@0.4 and `ada`@0.25 generations of held-out functions 1-24 (128 tokens),
each prompt with the switch on and off in alternating order: ms a token, verifying and drafting (one thread).

    python results/verify-steps/excess/switches.py
"""
import gc

import torch
from zoo import zoo

from specdecpp import speculative_generate

target, draft, head, prompts = zoo(0, 25)
methods = {"dynamic@0.4": dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4),
           "ada@0.25": dict(schedule="ada", head=head, stop_threshold=0.25, bound=(1, 20))}
for knobs in methods.values():
    speculative_generate(target, draft, prompts[0], max_new_tokens=128, eos_token_id=[], compile=True, **knobs)
heap = [{"a": [i] * 3} for i in range(300_000)]
switches = {"flush denormals": lambda on: torch.set_flush_denormal(on),
            "garbage collector off": lambda on: gc.disable() if on else gc.enable()}
print("| switch | method | on: ms/token, verifying, drafting | off |")
print("| --- | --- | --- | --- |")
for switch, turn in switches.items():
    totals = {}
    for i, prompt in enumerate(prompts[1:]):
        for on in ((True, False) if i % 2 else (False, True)):
            turn(on)
            for name, knobs in methods.items():
                stats = speculative_generate(target, draft, prompt, max_new_tokens=128, eos_token_id=[],
                                             compile=True, **knobs).stats
                total = totals.setdefault((name, on), [0.0, 0.0, 0.0, 0])
                for j, value in enumerate((stats.wall_time, stats.verify_time, stats.draft_time,
                                           stats.generated_length)):
                    total[j] += value
    turn(False)
    for name in methods:
        cells = [" ".join(f"{1000 * t / totals[name, on][3]:.3f}" for t in totals[name, on][:3]) for on in (True, False)]
        print(f"| {switch} | {name} | {cells[0]} | {cells[1]} |")
