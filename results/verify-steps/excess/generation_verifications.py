"""Each verification of real compiled `dynamic`@0.4 generations (held-out functions 1-8, 128 tokens, after a warm-up
prompt), timed as it ran and again at once on the same inputs, beside a step probe sampled between prompts (as the
time breakdown samples it). `--methods` interleaves constant K=3 and `ada`@0.25 too (their verifications untimed).

    python results/verify-steps/excess/generation_verifications.py [--methods]
"""
import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from harness import HEAD, load_pair, load_prompt_ids  # noqa: E402

import specdecpp.engine.decoding as decoding  # noqa: E402
from specdecpp import speculative_generate  # noqa: E402
from specdecpp.measuring.step_timing import StepProbe  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--methods", action="store_true")
args = parser.parse_args()
torch.set_num_threads(1)
target, draft, head = load_pair(head=HEAD)
prompts = load_prompt_ids("stdlib-heldout", n_end=9)
methods = {"dynamic@0.4": dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4),
           "constant K=3": dict(schedule="constant", num_assistant_tokens=3),
           "ada@0.25": dict(schedule="ada", head=head, stop_threshold=0.25, bound=(1, 20))}
names = list(methods) if args.methods else ["dynamic@0.4"]
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
context = speculative_generate(target, None, prompts[3], max_new_tokens=64, eos_token_id=[]).sequences
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
