"""The compiled draft's eager catch-up forwards (`StaticModel._feed` over tokens it has not seen) during the oracle's
and `dynamic`@0.4's generations, held-out stdlib functions 1-6 (0 a warm-up), 128 tokens. From the repository root:

    PYTHONPATH=benchmarks python results/verify-steps/oracle_feeds.py
"""
import sys, time
import torch
from specdecpp import speculative_generate
from specdecpp.engine import compiled
sys.path.insert(0, "benchmarks")
from harness import load_pair, load_prompt_ids
torch.set_num_threads(1)
target, draft, _ = load_pair()
prompts = load_prompt_ids("stdlib-heldout", n_end=7)
calls = {"feeds": 0, "ms": 0.0}
original = compiled.StaticModel._feed
def counted(self, tokens):
    start = time.perf_counter()
    ran = len(tokens) > min(self.length, len(tokens)) and isinstance(self, compiled.CompiledDraft)
    original(self, tokens)
    if ran:
        calls["feeds"] += 1; calls["ms"] += 1000 * (time.perf_counter() - start)
compiled.StaticModel._feed = counted
for name, kw in (("oracle", dict(schedule="oracle", bound=(1, 20))), ("dynamic@0.4", dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4))):
    speculative_generate(target, draft, prompts[0], max_new_tokens=128, eos_token_id=[], compile=True, **kw)
    calls.update(feeds=0, ms=0.0)
    zero = rounds = draft_ms = tokens = dc = 0
    for p in prompts[1:]:
        s = speculative_generate(target, draft, p, max_new_tokens=128, eos_token_id=[], compile=True, **kw).stats
        zero += s.draft_lengths.count(0); rounds += len(s.draft_lengths); draft_ms += 1000 * s.draft_time; tokens += s.generated_length; dc += s.draft_calls
    print(f"{name}: rounds {rounds}, drafting none {zero}, catch-up forwards {calls['feeds']} ({calls['ms']:.1f} ms, {calls['ms']/max(calls['feeds'],1):.2f} ms each), "
          f"draft time {draft_ms:.1f} ms over {dc} draft steps ({draft_ms/dc:.3f} ms each); without the catch-ups {(draft_ms-calls['ms'])/dc:.3f}")
