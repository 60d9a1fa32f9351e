"""Compiled verifications of real generations timed by length (`dynamic`@0.4, constant K=3, `ada`@0.25, held-out
stdlib functions 1-12, 128 tokens, interleaved), beside one StepProbe's price and median for each length. From the
repository root:

    PYTHONPATH=benchmarks python results/verify-steps/verify_by_length.py
"""
import statistics, sys, time
from collections import defaultdict
import torch
import specdecpp.engine.decoding as decoding
from specdecpp import speculative_generate
from specdecpp.measuring.step_timing import StepProbe
sys.path.insert(0, "benchmarks")
from harness import HEAD, load_pair, load_prompt_ids

torch.set_num_threads(1)
target, draft, head = load_pair(head=HEAD)
prompts = load_prompt_ids("stdlib-heldout", n_end=13)
context = speculative_generate(target, None, prompts[3], max_new_tokens=64, eos_token_id=[]).sequences
record = defaultdict(list)
current = [None]
original = decoding.verify
def timed_verify(target_model, seq, drafted, draft_probs, processing, generator):
    start = time.perf_counter()
    out = original(target_model, seq, drafted, draft_probs, processing, generator)
    if current[0] is not None:
        record[current[0], len(drafted), len(seq)].append(1000 * (time.perf_counter() - start))
    return out
decoding.verify = timed_verify
methods = {"dynamic@0.4": dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4),
           "constant K=3": dict(schedule="constant", num_assistant_tokens=3),
           "ada@0.25": dict(schedule="ada", head=head, stop_threshold=0.25, bound=(1, 20))}
probe = StepProbe(target, draft, context, 20, compile=True)
with torch.inference_mode():
    for i, prompt in enumerate(prompts):
        for name in list(methods)[i % 3:] + list(methods)[:i % 3]:
            current[0] = name if i else None
            speculative_generate(target, draft, prompt, max_new_tokens=128, eos_token_id=[], compile=True, **methods[name])
        current[0] = None
        probe.sample()
times = probe.times()
print("context of the probe", context.shape[1])
print("k | probe fit | probe measured | " + " | ".join(methods))
for k in range(0, 9):
    cells = []
    for name in methods:
        v = [x for (n, kk, L), xs in record.items() if n == name and kk == k for x in xs]
        cells.append(f"{statistics.median(v):.3f} (n={len(v)})" if v else "-")
    print(f"{k} | {times.verify_ms[k]:.3f} | {times.verify_ms_measured[k]:.3f} | " + " | ".join(cells))
# context dependence for k=1..3
for name in methods:
    for k in (1, 2, 3):
        pairs = [(L, x) for (n, kk, L), xs in record.items() if n == name and kk == k for x in xs]
        if len(pairs) > 20:
            pairs.sort()
            half = len(pairs) // 2
            print(name, k, "short ctx", f"{statistics.median([x for _, x in pairs[:half]]):.3f}", "long ctx", f"{statistics.median([x for _, x in pairs[half:]]):.3f}")
