"""Compiled generations (held-out functions whose prompt and 128 tokens fit a 256-token engine, after a warm-up
prompt): each verification's time over the step probe's price for its length (the probe on the same engine, sampled
between prompts), by the round's place in its generation. `dynamic`@0.4 by default, `--ada` for `ada`@0.25,
`--eager` for the eager engine.

    python results/verify-steps/excess/by_round.py [--ada] [--eager]
"""
import statistics
import sys
from collections import defaultdict

from zoo import continued, time_verifications, zoo

from specdecpp import speculative_generate
from specdecpp.measuring.step_timing import StepProbe

target, draft, head, prompts = zoo(0, 40)
prompts = [p for p in prompts if p.shape[1] + 128 <= 256][:16]
compile = "--eager" not in sys.argv
schedule = dict(schedule="ada", head=head, stop_threshold=0.25, bound=(1, 20)) if "--ada" in sys.argv else \
    dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4)
timed = []
time_verifications(timed)
probe = StepProbe(target, draft, continued(target, prompts[3], 64), 20, compile=compile, max_length=256)
rounds = []
for i, prompt in enumerate(prompts):
    probe.sample()
    timed.clear()
    speculative_generate(target, draft, prompt, max_new_tokens=128, eos_token_id=[], compile=compile, **schedule)
    if i:
        rounds += [(place, k, ms) for place, (k, ms) in enumerate(timed) if place]  # the first reads the prompt
prices = probe.times().verify_ms
spans = ((1, 5), (6, 10), (11, 20), (21, 30), (31, 999))
by_span = defaultdict(list)
for place, k, ms in rounds:
    by_span[next(span for span in spans if span[0] <= place <= span[1])].append((ms, prices[k]))
print(f"{'compiled' if compile else 'eager'} {schedule['schedule']}, {len(prompts) - 1} generations")
print("| rounds | verifications | measured / priced (sums) | median of the ratios |\n| --- | ---: | ---: | ---: |")
for span, pairs in sorted(by_span.items()):
    print(f"| {span[0]}-{span[1] if span[1] < 999 else 'end'} | {len(pairs)} | "
          f"{sum(m for m, _ in pairs) / sum(p for _, p in pairs):.3f} | {statistics.median(m / p for m, p in pairs):.3f} |")
print(f"all: {sum(ms for _, _, ms in rounds) / sum(prices[k] for _, k, _ in rounds):.3f}")
