"""What the compiled engine's guards cost, with every guard Dynamo makes, with torch's portable set
(`keep_portable_guards_unsafe`) and with the engine's (`compat.COMPILE_GUARD_FILTER`: portable less the
parameters'). Each variant decodes on its own copy of the models, so all coexist and calls interleave.
One torch thread: `python results/compiled-guards/guard_cost.py` from the repository root."""
import copy
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specdecpp import AcceptancePredictionHead, speculative_generate
from specdecpp.compat import COMPILE_GUARD_FILTER
from specdecpp.data.prompts import load_prompts
from specdecpp.engine import compiled
from specdecpp.engine.processing import sampling_only

torch.set_num_threads(1)
VARIANTS = {"every guard": None, "portable": torch.compiler.keep_portable_guards_unsafe,
            "portable less parameters (ours)": COMPILE_GUARD_FILTER}


def guard_ms(run, calls: int) -> float:
    """CPU ms per call spent in Dynamo's cache lookup (the guards) over `run()`."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key == "TorchDynamo Cache Lookup") / 1000 / calls


def engines_for(target, draft, head, variant):
    compiled.COMPILE_GUARD_FILTER = VARIANTS[variant]
    return compiled.compiled_models(target, draft, 256, sampling_only(False), head)


print("## One compiled draft step (context 64), random Llamas of width 64 and the zoo draft\n")
print("| draft | guards | step ms (median) | guard lookup ms per call |\n| --- | --- | ---: | ---: |")
zoo_target = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/target").eval()
zoo_draft = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/draft").eval()
head = AcceptancePredictionHead.from_pretrained("checkpoints/zoo/head")
drafts = {"zoo draft (1 layer, width 256), judged": (zoo_draft, head)}
for layers in (8, 30):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512)
    drafts[f"{layers} layers"] = (LlamaForCausalLM(config).eval(), None)
seq = list(range(5, 69))
for name, (model, judge) in drafts.items():
    steps = {v: engines_for(copy.deepcopy(model), copy.deepcopy(model), judge, v)[1] for v in VARIANTS}
    times = {v: [] for v in VARIANTS}
    with torch.inference_mode():
        for repeat in range(220):
            for variant, step in steps.items():
                start = time.perf_counter()
                step.draft_step(seq, 1, None)
                if repeat >= 20:
                    times[variant].append(1000 * (time.perf_counter() - start))
                step.crop(len(seq) - 1)
        for variant, step in steps.items():
            def run():
                for _ in range(30):
                    step.draft_step(seq, 1, None)
                    step.crop(len(seq) - 1)
            print(f"| {name} | {variant} | {statistics.median(times[variant]):.3f} | {guard_ms(run, 30):.3f} |",
                  flush=True)

print("\n## Generations: zoo pair, stdlib-heldout 0-3, 96 new tokens, greedy, interleaved per prompt\n")
tokenizer = AutoTokenizer.from_pretrained("checkpoints/zoo/target")
prompts = [tokenizer(p, return_tensors="pt").input_ids for p in load_prompts("stdlib-heldout", n_end=4)]
methods = {"target alone": {}, "dynamic@0.4": dict(schedule="dynamic", stop_threshold=0.4),
           "ada@auto": dict(schedule="ada", head=head, stop_threshold="auto")}
pairs = {v: (copy.deepcopy(zoo_target), copy.deepcopy(zoo_draft)) for v in ("every guard", "portable less parameters (ours)")}


def generate(variant, method, prompt):
    target, draft = pairs[variant]
    compiled.COMPILE_GUARD_FILTER = VARIANTS[variant]  # read when an engine's graphs are built
    out = speculative_generate(target, None if method == "target alone" else draft, prompt, max_new_tokens=96,
                               compile=True, **methods[method])
    return out.stats.wall_time, out.sequences.shape[1] - prompt.shape[1], out.stats.target_calls + out.stats.draft_calls


for variant in pairs:  # compile first
    for method in methods:
        generate(variant, method, prompts[0])
ms = {}
for repeat in range(3):
    for prompt in prompts:
        for method in methods:
            for variant in pairs:
                seconds, tokens, _ = generate(variant, method, prompt)
                ms.setdefault((method, variant), []).append(1000 * seconds / tokens)
print("| method | guards | ms/token (median of 12) | guard lookup ms per token | calls per token |")
print("| --- | --- | ---: | ---: | ---: |")
for method in methods:
    for variant in pairs:
        counts = []

        def run():
            counts.extend(generate(variant, method, p) for p in prompts)
        lookup = guard_ms(run, 1)
        tokens, calls = sum(c[1] for c in counts), sum(c[2] for c in counts)
        print(f"| {method} | {variant} | {statistics.median(ms[method, variant]):.3f} | {lookup / tokens:.3f} | "
              f"{calls / tokens:.3f} |", flush=True)
