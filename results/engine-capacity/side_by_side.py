"""Compiled generations on the engine of their own capacity (256 for every prompt here but two) against the one
the engine took before, the largest built so far (512, built by the warm-up's longest prompt), interleaved prompt
by prompt: held-out stdlib functions 1-24, 128 new tokens, greedy, EOS off, one thread; each beside what its counts
predict at step times probed on the same capacity (as `time_breakdown.py` predicts). From the repository root:

    python results/engine-capacity/side_by_side.py    # side_by_side.txt
"""
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from harness import HEAD, load_pair, load_prompt_ids, rotated  # noqa: E402

from specdecpp import speculative_generate  # noqa: E402
from specdecpp.costs import judged_tokens  # noqa: E402
from specdecpp.engine import compiled  # noqa: E402
from specdecpp.measuring.step_timing import StepProbe, measure_round_overhead, prefill_extra_ms  # noqa: E402

torch.set_num_threads(1)
target, draft, head = load_pair(head=HEAD)
prompts = load_prompt_ids("stdlib-heldout", n_end=25)
own_capacity = compiled.capacity_for
methods = {"target alone": dict(schedule="none"),
           "dynamic@0.4": dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4),
           "ada@auto": dict(schedule="ada", head=head, stop_threshold="auto", bound=(1, 20))}
grid = [(name, capacity) for name in methods for capacity in ("own", 512)]


def on_capacity(capacity):
    compiled.capacity_for = own_capacity if capacity == "own" else lambda max_length: max(512, own_capacity(max_length))


def run(method, prompt):
    name, capacity = method
    on_capacity(capacity)
    return speculative_generate(target, None if name == "target alone" else draft, prompt, max_new_tokens=128,
                                eos_token_id=[], compile=True, **methods[name])


for method in grid:  # every engine built and compiled before anything is timed
    for prompt in compiled.longest_per_capacity(prompts, lambda p: p.shape[1] + 128):
        run(method, prompt)
ms, tokens, outputs, runs = dict.fromkeys(grid, 0.0), dict.fromkeys(grid, 0), {}, []
for i, prompt in enumerate(prompts[1:]):
    for method in rotated(grid, i):
        start = time.perf_counter()
        out = run(method, prompt)
        ms[method] += 1000 * out.stats.wall_time
        tokens[method] += out.stats.generated_length
        outputs.setdefault(i, []).append(out.sequences)
        runs.append((method, prompt, out.stats))
assert all(all(torch.equal(o, outs[0]) for o in outs) for outs in outputs.values()), "outputs differ"
# Step times probed on each capacity (a context of 150 tokens: 256 on its own), priced as time_breakdown prices.
context = speculative_generate(target, None, prompts[3], max_new_tokens=64, eos_token_id=[]).sequences
predicted = dict.fromkeys(grid, 0.0)
for capacity in ("own", 512):
    on_capacity(capacity)
    plain, judged = (StepProbe(target, draft, context, 20, head=h, compile=True) for h in (None, head))
    for _ in range(4):
        plain.sample(), judged.sample()
    overhead = measure_round_overhead(target, draft, context, compile=True)
    times = {False: plain.times(), True: judged.times()}
    for t in times.values():
        t.round_overhead_ms = overhead
    for (name, cap), prompt, stats in runs:
        if cap == capacity:
            alone, is_ada = name == "target alone", name.startswith("ada")
            on_capacity(capacity)
            extra = sum(prefill_extra_ms(target, None if alone else draft, prompt, times[False], compile=True))
            count = judged_tokens(stats.draft_lengths, head.alignment if is_ada else None)
            predicted[name, cap] += times[is_ada].predicted_ms(stats.draft_lengths, count, not alone) + extra
print("| method | own capacity, ms/token (predicted) | 512, ms/token (predicted) | 512 over own (predicted) |")
print("| --- | ---: | ---: | ---: |")
for name in methods:
    own, large = ms[name, "own"] / tokens[name, "own"], ms[name, 512] / tokens[name, 512]
    own_p, large_p = predicted[name, "own"] / tokens[name, "own"], predicted[name, 512] / tokens[name, 512]
    print(f"| {name} | {own:.3f} ({own_p:.3f}) | {large:.3f} ({large_p:.3f}) | {large / own:.3f}x ({large_p / own_p:.3f}x) |")
print("capacities needed:", sorted({own_capacity(p.shape[1] + 128) for p in prompts[1:]}),
      "; prompts over 128 tokens:", sum(p.shape[1] > 128 for p in prompts[1:]))
