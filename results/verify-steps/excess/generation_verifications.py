"""Each verification of real compiled `dynamic`@0.4 generations (held-out functions 1-8, 128 tokens, after a warm-up
prompt), timed as it ran and again at once on the same inputs, beside a step probe sampled between prompts (as the
time breakdown samples it). `--methods` interleaves constant K=3 and `ada`@0.25 too (their verifications untimed).

    python results/verify-steps/excess/generation_verifications.py [--methods]
"""
import statistics
import sys
import time
from collections import defaultdict

from zoo import continued, zoo

import specdecpp.engine.decoding as decoding
from specdecpp import speculative_generate
from specdecpp.measuring.step_timing import StepProbe

target, draft, head, prompts = zoo(0, 9)
methods = {"dynamic@0.4": dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4),
           "constant K=3": dict(schedule="constant", num_assistant_tokens=3),
           "ada@0.25": dict(schedule="ada", head=head, stop_threshold=0.25, bound=(1, 20))}
names = list(methods) if "--methods" in sys.argv[1:] else ["dynamic@0.4"]
verify, timed_now, record = decoding.verify, [False], defaultdict(list)


def timed_verify(target_model, seq, drafted, *rest):
    start = time.perf_counter()
    out = verify(target_model, seq, drafted, *rest)
    first = 1000 * (time.perf_counter() - start)
    if timed_now[0]:
        target_model.crop(len(seq) - 1)
        start = time.perf_counter()
        assert verify(target_model, seq, drafted, *rest) == out
        record[len(drafted)].append((first, 1000 * (time.perf_counter() - start)))
    return out


decoding.verify = timed_verify
context = continued(target, prompts[3], 64)
probe = StepProbe(target, draft, context, 20, compile=True)
for i, prompt in enumerate(prompts):
    timed_now[0] = False
    probe.sample()
    for name in names[i % len(names):] + names[:i % len(names)]:
        timed_now[0] = i > 0 and name == "dynamic@0.4"
        speculative_generate(target, draft, prompt, max_new_tokens=128, eos_token_id=[], compile=True, **methods[name])
timed_now[0] = False
prices = probe.times().verify_ms_measured
print(f"methods interleaved: {', '.join(names)}")
print("| drafted | verifications | in the generation (median ms) | repeated at once | probe's median |")
print("| ---: | ---: | ---: | ---: | ---: |")
for k in sorted(record)[:7]:
    first, again = zip(*record[k])
    print(f"| {k} | {len(first)} | {statistics.median(first):.3f} | {statistics.median(again):.3f} | {prices[k]:.3f} |")
print("(a generation's first verification reads its prompt too: the prefill, priced apart)")
