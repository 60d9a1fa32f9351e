"""The first verification of each compiled `dynamic`@0.4 generation (held-out functions 1-24, 128 tokens), which
also reads the prompt, beside its price as the time breakdown sets it: the verification's price for its length plus
`prefill_extra_ms` (one thread).

    python results/verify-steps/excess/prefill.py
"""
from zoo import continued, time_verifications, zoo

import specdecpp.engine.decoding as decoding
from specdecpp import speculative_generate
from specdecpp.measuring.step_timing import StepProbe, prefill_extra_ms

target, draft, _, prompts = zoo(0, 25)
knobs = dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4)
verify, first = decoding.verify, []
time_verifications(first)
rows = []
for prompt in prompts:
    first.clear()
    speculative_generate(target, draft, prompt, max_new_tokens=128, eos_token_id=[], compile=True, **knobs)
    rows.append((prompt, *first[0]))
decoding.verify = verify
context = continued(target, prompts[3], 64)
probe = StepProbe(target, draft, context, 20, compile=True)
for _ in range(4):
    probe.sample()
times = probe.times()
measured = priced = 0.0
print("| prompt tokens | drafted | first verification (ms) | priced |")
print("| ---: | ---: | ---: | ---: |")
for prompt, k, ms in rows[1:]:  # the first prompt is a warm-up
    price = times.verify_ms[k] + prefill_extra_ms(target, draft, prompt, times, compile=True,
                                                  max_length=prompt.shape[1] + 128)[0]
    measured, priced = measured + ms, priced + price
    print(f"| {prompt.shape[1]} | {k} | {ms:.2f} | {price:.2f} |")
print(f"sum: {measured:.1f} ms measured, {priced:.1f} ms priced")
