"""Where the eager judgement's price comes from: the zoo draft's eager step without a head, with the hidden state
captured but no judgement, and judged; then the judgement alone (features and blocks apart), each timed hot (in a
loop) and cold (right after a 6-token eager target verification, as decoding runs it). One torch thread, float32,
medians. From the repository root:

    python results/zoo-head-retrained/judge_cold.py checkpoints/zoo/head
"""
import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from specdecpp import AcceptancePredictionHead
from specdecpp.engine.draft_step import CachedModel, EagerDraft
from specdecpp.engine.processing import sampling_only
from specdecpp.head.model import LeanJudge, head_state, logit_features

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("head")
parser.add_argument("--repeats", type=int, default=400)
args = parser.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)
target = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/target").eval()
draft = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/draft").eval()
head = AcceptancePredictionHead.from_pretrained(args.head)
judge = LeanJudge(head)
projection, blocks, accept_weight, accept_bias = judge.layers


hidden_only = EagerDraft(draft, sampling_only(False))  # the judged step's forward (hidden state captured), unjudged
hidden_only.with_hidden_states = True
steps = {"plain step": EagerDraft(draft, sampling_only(False)), "step, hidden state captured": hidden_only,
         "judged step": EagerDraft(draft, sampling_only(False), judge)}
hidden, logits = torch.randn(draft.config.hidden_size), torch.randn(draft.config.vocab_size) * 3
probs, token = logits.softmax(-1), logits.argmax()
features = logit_features(logits, token, judge.features, probs) if judge.features else None
parts = {"judgement": lambda: judge(hidden, logits, token, probs),
         "blocks and output": lambda: head_state(hidden, features, projection, blocks, accept_weight) @ accept_weight
         + accept_bias}
if judge.features:  # a head of the hidden state alone computes none
    parts["features"] = lambda: logit_features(logits, token, judge.features, probs)
verifier = CachedModel(target)
seq, verified = list(range(5, 69)), list(range(5, 75))
timed = {name: (lambda model=model: model.draft_step(seq, 1, None)) for name, model in steps.items()} | parts
cold, hot = {name: [] for name in timed}, {}
with torch.inference_mode():
    verifier.logits(verified[:60], 60)
    for model in steps.values():
        model.forward(seq[:-1], 1)
    for _ in range(args.repeats):
        for name, run in timed.items():  # each right after a verification, as decoding runs a draft step
            verifier.logits(verified, 6)
            verifier.crop(60)
            start = time.perf_counter()
            run()
            cold[name].append(1000 * (time.perf_counter() - start))
            for model in steps.values():
                model.crop(len(seq) - 1)
    for name, part in parts.items():
        for _ in range(200):
            part()
        start = time.perf_counter()
        for _ in range(2000):
            part()
        hot[name] = (time.perf_counter() - start) / 2
plain = statistics.median(cold["plain step"][10:])
print(f"{args.head}: {sum(t.numel() for t in head.parameters()):,} parameters, {len(judge.features)} features\n")
print("| what | after a verification, ms | over the plain step | in a hot loop, ms |\n| --- | ---: | ---: | ---: |")
for name, times in cold.items():
    ms = statistics.median(times[10:])
    print(f"| {name} | {ms:.3f} | {ms / plain:.3f}x | {f'{hot[name]:.3f}' if name in hot else ''} |")
