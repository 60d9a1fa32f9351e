"""Where eager `ada` (0.4) and `dynamic` (0.4) spend decoding time, draft steps and verifications apart, beside
what one StepProbe per method predicts for the rounds they drafted (zoo pair, stdlib-heldout 1-6, 128 tokens)."""
import statistics

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from specdecpp import AcceptancePredictionHead, speculative_generate
from specdecpp.data import stdlib_corpus
from specdecpp.measuring.step_timing import StepProbe
torch.set_num_threads(1)
Z = "checkpoints/zoo"
target = AutoModelForCausalLM.from_pretrained(f"{Z}/target", dtype=torch.float32)
draft = AutoModelForCausalLM.from_pretrained(f"{Z}/draft", dtype=torch.float32)
tok = AutoTokenizer.from_pretrained(f"{Z}/target")
head = AcceptancePredictionHead.from_pretrained(f"{Z}/head")
prompts = [torch.tensor([tok(f.prompt)["input_ids"]]) for f in stdlib_corpus.heldout_functions()[:7]]
context = speculative_generate(target, None, prompts[3], max_new_tokens=64, eos_token_id=[]).sequences
probes = {"dynamic": StepProbe(target, draft, context, 20), "ada": StepProbe(target, draft, context, 20, head=head)}
methods = {"dynamic": dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4),
           "ada": dict(schedule="ada", head=head, stop_threshold=0.4, bound=(1, 20))}
acc = {m: dict(draft=0.0, verify=0.0, sched=0.0, wall=0.0, lengths=[], calls=0, tcalls=0, tokens=0) for m in methods}
with torch.inference_mode():
    for i, p in enumerate(prompts):
        order = list(methods) if i % 2 else list(methods)[::-1]
        for m in order:
            s = speculative_generate(target, draft, p, max_new_tokens=128, eos_token_id=[], **methods[m]).stats
            if i == 0:
                continue
            a = acc[m]
            for key, value in (("draft", s.draft_time), ("verify", s.verify_time), ("sched", s.schedule_time),
                               ("wall", s.wall_time), ("lengths", s.draft_lengths), ("calls", s.draft_calls),
                               ("tcalls", s.target_calls), ("tokens", s.generated_length)):
                a[key] += value
        for probe in probes.values():
            probe.sample()
for m, a in acc.items():
    t = probes[m].times()
    pred_draft = sum(sum(t.draft_ms[:k]) for k in a["lengths"])
    pred_verify = sum(t.verify_ms[min(k, len(t.verify_ms) - 1)] for k in a["lengths"])
    print(f"{m}: per token wall {1000*a['wall']/a['tokens']:.3f} ms; draft measured {1000*a['draft']/a['tokens']:.3f} "
          f"predicted {pred_draft/a['tokens']:.3f} ({1000*a['draft']/pred_draft:.3f}x); verify measured "
          f"{1000*a['verify']/a['tokens']:.3f} predicted {pred_verify/a['tokens']:.3f} ({1000*a['verify']/pred_verify:.3f}x); "
          f"stop decision {1000*a['sched']/a['tokens']:.3f}; rest {1000*(a['wall']-a['draft']-a['verify']-a['sched'])/a['tokens']:.3f}; "
          f"draft step mean measured {1000*a['draft']/a['calls']:.3f}, probe median j5-20 {statistics.median(t.draft_ms[4:20]):.3f}")
