"""Compiled draft steps of real generations by their position in the round and the tokens they feed (two after a
fully accepted round), against each method's probe, and their mean over their median; `dynamic`@0.4 and `ada`@0.25,
held-out stdlib functions 1-12, 128 tokens, interleaved. From the repository root:

    PYTHONPATH=benchmarks python results/verify-steps/draft_by_position.py
"""
import statistics, sys, time
from collections import defaultdict
import torch
from specdecpp import speculative_generate
from specdecpp.engine import compiled
from specdecpp.measuring.step_timing import StepProbe
sys.path.insert(0, "benchmarks")
from harness import HEAD, load_pair, load_prompt_ids
torch.set_num_threads(1)
target, draft, head = load_pair(head=HEAD)
prompts = load_prompt_ids("stdlib-heldout", n_end=13)
context = speculative_generate(target, None, prompts[3], max_new_tokens=64, eos_token_id=[]).sequences
record = defaultdict(list)
current = [None]
original = compiled.CompiledDraft.draft_step
def timed(self, tokens, num_drafted, generator):
    unseen = len(tokens) - self.length
    start = time.perf_counter()
    out = original(self, tokens, num_drafted, generator)
    if current[0]:
        record[current[0], min(num_drafted, 5), unseen].append(1000 * (time.perf_counter() - start))
    return out
compiled.CompiledDraft.draft_step = timed
methods = {"dynamic@0.4": dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4),
           "ada@0.25": dict(schedule="ada", head=head, stop_threshold=0.25, bound=(1, 20))}
probes = {"dynamic@0.4": StepProbe(target, draft, context, 8, compile=True),
          "ada@0.25": StepProbe(target, draft, context, 8, head=head, compile=True)}
with torch.inference_mode():
    for i, prompt in enumerate(prompts):
        for name in list(methods)[i % 2:] + list(methods)[:i % 2]:
            current[0] = name if i else None
            speculative_generate(target, draft, prompt, max_new_tokens=128, eos_token_id=[], compile=True, **methods[name])
        current[0] = None
        for p in probes.values():
            p.sample()
for name in methods:
    allv = [x for (n, j, u), v in record.items() if n == name for x in v]
    print(name, f"all real steps: mean {statistics.mean(allv):.4f} median {statistics.median(allv):.4f} mean/median {statistics.mean(allv)/statistics.median(allv):.3f} n={len(allv)}; over 1 ms: {sum(x > 1.0 for x in allv)}")
    pd = [x for times in probes[name].drafts for x in times]
    print(name, f"probe steps: mean {statistics.mean(pd):.4f} median {statistics.median(pd):.4f} mean/median {statistics.mean(pd)/statistics.median(pd):.3f}")
    t = probes[name].times()
    print(name, "probe j=1..5", " ".join(f"{x:.3f}" for x in t.draft_ms[:5]))
    for unseen in (1, 2):
        cells = []
        for j in range(1, 6):
            v = record[name, j, unseen]
            cells.append(f"{statistics.median(v):.3f} (n={len(v)})" if v else "-")
        print(f"   real, fed {unseen}: j=1..5(+)", " | ".join(cells))
