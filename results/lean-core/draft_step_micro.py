"""One draft step of the zoo draft, eager and compiled, without a head and judged by heads of three
kinds, interleaved, at a fixed 64-token context (one torch thread): `python draft_step_micro.py`
from the repository root."""
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from specdecpp import AcceptancePredictionHead
from specdecpp.engine.compiled import compiled_models
from specdecpp.engine.draft_step import EagerDraft
from specdecpp.engine.processing import sampling_only
from specdecpp.head.model import LeanJudge

torch.set_num_threads(1)
target = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/target").eval()
draft = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/draft").eval()
zoo = AcceptancePredictionHead.from_pretrained("checkpoints/zoo/head")
heads = {"no head": None, "zoo head (3 blocks, hidden + 3 features)": zoo,
         "3 blocks, 3 features only": AcceptancePredictionHead(0, 3, alignment="proposer", features=zoo.features),
         "3 blocks, hidden only": AcceptancePredictionHead(256, 3, alignment="proposer")}
seq, drafts = list(range(5, 69)), {}
for name, head in heads.items():
    drafts["eager", name] = EagerDraft(draft, sampling_only(False), LeanJudge(head) if head is not None else None)
    drafts["compiled", name] = compiled_models(target, draft, 256, sampling_only(False), head)[1]
times = {key: [] for key in drafts}
with torch.inference_mode():
    for repeat in range(310):
        for key, model in drafts.items():
            start = time.perf_counter()
            model.draft_step(seq, 1, None)
            if repeat >= 10:
                times[key].append(1000 * (time.perf_counter() - start))
            model.crop(len(seq) - 1)
print("| engine | draft step | median ms | over no head |\n| --- | --- | ---: | ---: |")
for engine, name in drafts:
    ms = statistics.median(times[engine, name])
    print(f"| {engine} | {name} | {ms:.3f} | {ms / statistics.median(times[engine, 'no head']):.2f}x |")
