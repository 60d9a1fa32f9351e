"""Where a compiled judged draft step's extra time goes: the zoo draft's compiled step without a head and
judged by the zoo head, profiled as decoding runs it (a 6-token verification, then draft steps 1 to 11),
one torch thread, float32, from the repository root:

    python results/lean-core/judged_step_profile.py      # judged_step_profile.txt

Prints, per step, the time of each profiler row that differs between the two engines by more than 2 us."""
import re

import torch
import torch._inductor.config as inductor_config
from transformers import AutoModelForCausalLM

from specdecpp import AcceptancePredictionHead
from specdecpp.engine.compiled import compiled_models
from specdecpp.engine.processing import sampling_only

inductor_config.cpp.enable_kernel_profile = True  # inductor's C++ kernels as profiler rows
torch.set_num_threads(1)
target = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/target").eval()
draft = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/draft").eval()
head = AcceptancePredictionHead.from_pretrained("checkpoints/zoo/head")
seq, rounds, rows = list(range(5, 117)), 30, {}
engines = {name: compiled_models(target, draft, 256, sampling_only(False), judging)[:2]
           for name, judging in (("no head", None), ("zoo head", head))}


def decode_round(name: str) -> None:
    target_model, draft_model = engines[name]
    target_model.crop(len(seq) - 6)
    target_model.logits(seq, 6)
    draft_model.crop(100)
    for j in range(1, 12):  # steps 2 to 11 timed
        with torch.profiler.record_function(name if j > 1 else "first draft step"):
            draft_model.draft_step(seq[:100 + j], j, None)


with torch.inference_mode():
    for _ in range(10):
        for name in engines:
            decode_round(name)
    with torch.profiler.profile() as profile:  # the engines interleaved, round by round
        for _ in range(rounds):
            for name in engines:
                decode_round(name)
for event in profile.events():  # the rows inside timed draft steps, by engine and name
    parent = event
    while parent is not None and parent.name not in engines:
        parent = parent.cpu_parent
    if parent is not None:
        key = re.sub(r"graph_\d+_cpp_fused_(.*?)_\d+$", r"graph kernel \1", event.name)
        key = "graph kernel: softmax, token choice (with a head: its features and blocks)" \
            if key.startswith("graph kernel _softmax") and "argmax" in key else key[:80]
        key = re.sub(r"^(Torch-Compiled Region): .*", r"\1", key)
        key = "call of the draft graph (inductor's wrapper)" if key.startswith("## Call CompiledFxGraph") else key
        key = "draft step (Python)" if key in engines else key
        rows.setdefault(key, {}).setdefault(parent.name, 0.0)
        rows[key][parent.name] += event.self_cpu_time_total / (rounds * 10)
print("| profiler row (self time) | no head, us/step | zoo head, us/step | difference |\n| --- | ---: | ---: | ---: |")
for key, times in sorted(rows.items(), key=lambda item: item[1].get("no head", 0) - item[1].get("zoo head", 0)):
    plain, judged = times.get("no head", 0.0), times.get("zoo head", 0.0)
    if abs(judged - plain) > 2:
        print(f"| {key} | {plain:.1f} | {judged:.1f} | {judged - plain:+.1f} |")
print(f"| all rows | {sum(t.get('no head', 0) for t in rows.values()):.1f} | "
      f"{sum(t.get('zoo head', 0) for t in rows.values()):.1f} | |")
