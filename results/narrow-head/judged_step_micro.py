"""One draft step of the zoo draft, eager and compiled, without a head and judged by each head given, every variant
timed in turn after a 6-token target verification (as decoding runs them: the verification evicts the draft's and
the head's weights from the caches), at a fixed 64-token context, one torch thread, float32. From the repository root:

    python results/narrow-head/judged_step_micro.py checkpoints/zoo/head outputs/curve/margin64-6188
"""
import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from specdecpp import AcceptancePredictionHead
from specdecpp.engine.compiled import compiled_models
from specdecpp.engine.draft_step import EagerDraft
from specdecpp.engine.processing import sampling_only
from specdecpp.head.model import LeanJudge

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("heads", nargs="+")
parser.add_argument("--repeats", type=int, default=300)
args = parser.parse_args()
torch.set_num_threads(1)
target = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/target").eval()
draft = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/draft").eval()
heads = {"no head": None, **{path: AcceptancePredictionHead.from_pretrained(path) for path in args.heads}}
drafts = {}
for name, head in heads.items():
    drafts["eager", name] = EagerDraft(draft, sampling_only(False), LeanJudge(head) if head is not None else None)
    drafts["compiled", name] = compiled_models(target, draft, 256, sampling_only(False), head)[1]
verifier = compiled_models(target, None, 256, sampling_only(False))[0]
seq, verified = list(range(5, 69)), list(range(5, 75))
times = {key: [] for key in drafts}
with torch.inference_mode():
    for repeat in range(args.repeats):
        for key, model in drafts.items():
            verifier.logits(verified, 6)
            verifier.crop(60)
            start = time.perf_counter()
            model.draft_step(seq, 1, None)
            if repeat >= 10:
                times[key].append(1000 * (time.perf_counter() - start))
            model.crop(len(seq) - 1)
print("| engine | draft step | judge's parameters | median ms | over no head |\n| --- | --- | ---: | ---: | ---: |")
for engine, name in drafts:
    ms = statistics.median(times[engine, name])
    params = sum(t.numel() for t in heads[name].parameters()) if heads[name] is not None else 0
    print(f"| {engine} | {name} | {params:,} | {ms:.3f} | {ms / statistics.median(times[engine, 'no head']):.3f}x |")
