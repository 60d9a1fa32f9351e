"""Steps of real compiled generations (held-out stdlib functions 1-12, 128 tokens, methods interleaved) beside what
the step probe prices them at. By default every verification by its length (`dynamic`@0.4, constant K=3,
`ada`@0.25), beside one probe's price and median for each length; with `--draft_steps`, every draft step by its
position in the round and the tokens it feeds (two after a fully accepted round), beside each method's own probe
(`dynamic`@0.4, `ada`@0.25), and their mean over their median. From the repository root:

    PYTHONPATH=benchmarks python results/verify-steps/real_steps.py                # verify_by_length.txt
    PYTHONPATH=benchmarks python results/verify-steps/real_steps.py --draft_steps  # draft_by_position.txt
"""
import argparse
import statistics
import sys
import time
from collections import defaultdict

import torch

import specdecpp.engine.decoding as decoding
from specdecpp import speculative_generate
from specdecpp.engine import compiled
from specdecpp.measuring.step_timing import StepProbe

sys.path.insert(0, "benchmarks")
from harness import HEAD, load_pair, load_prompt_ids  # noqa: E402  (the benchmarks' shared loading)

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--draft_steps", action="store_true")
args = parser.parse_args()
torch.set_num_threads(1)
target, draft, head = load_pair(head=HEAD)
prompts = load_prompt_ids("stdlib-heldout", n_end=13)
context = speculative_generate(target, None, prompts[3], max_new_tokens=64, eos_token_id=[]).sequences
methods = {"dynamic@0.4": dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4),
           "constant K=3": dict(schedule="constant", num_assistant_tokens=3),
           "ada@0.25": dict(schedule="ada", head=head, stop_threshold=0.25, bound=(1, 20))}
record, current = defaultdict(list), [None]  # (method, length or (position, tokens fed)) -> ms; the method running

if args.draft_steps:
    del methods["constant K=3"]
    probes = {name: StepProbe(target, draft, context, 8, head=head if name.startswith("ada") else None, compile=True)
              for name in methods}
    draft_step = compiled.CompiledDraft.draft_step

    def timed_draft_step(model, tokens, num_drafted, generator):
        fed, start = len(tokens) - model.length, time.perf_counter()
        out = draft_step(model, tokens, num_drafted, generator)
        if current[0]:
            record[current[0], (min(num_drafted, 5), fed)].append(1000 * (time.perf_counter() - start))
        return out
    compiled.CompiledDraft.draft_step = timed_draft_step
else:
    probes = {"all": StepProbe(target, draft, context, 20, compile=True)}
    verify = decoding.verify

    def timed_verify(target_model, seq, drafted, *rest):
        start = time.perf_counter()
        out = verify(target_model, seq, drafted, *rest)
        if current[0]:
            record[current[0], len(drafted)].append(1000 * (time.perf_counter() - start))
        return out
    decoding.verify = timed_verify

with torch.inference_mode():
    for i, prompt in enumerate(prompts):
        for name in list(methods)[i % len(methods):] + list(methods)[:i % len(methods)]:
            current[0] = name if i else None  # the first prompt is a warm-up
            speculative_generate(target, draft, prompt, max_new_tokens=128, eos_token_id=[], compile=True,
                                 **methods[name])
        current[0] = None
        for probe in probes.values():
            probe.sample()


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} (n={len(values)})" if values else "-"


if args.draft_steps:
    for name, probe in probes.items():
        steps = [ms for (method, _), times in record.items() if method == name for ms in times]
        probed = [ms for times in probe.drafts for ms in times]
        for what, times in (("all real steps", steps), ("probe steps", probed)):
            mean, median = statistics.mean(times), statistics.median(times)
            print(f"{name} {what}: mean {mean:.4f} median {median:.4f} mean/median {mean / median:.3f} "
                  f"n={len(times)}; over 1 ms: {sum(ms > 1.0 for ms in times)}")
        print(name, "probe j=1..5", " ".join(f"{ms:.3f}" for ms in probe.times().draft_ms[:5]))
        for fed in (1, 2):
            print(f"   real, fed {fed}: j=1..5(+)", " | ".join(cell(record[name, (j, fed)]) for j in range(1, 6)))
else:
    times = probes["all"].times()
    print("context of the probe", context.shape[1])
    print("k | probe price | probe median | " + " | ".join(methods))
    for k in range(9):
        print(f"{k} | {times.verify_ms[k]:.3f} | {times.verify_ms_measured[k]:.3f} | "
              + " | ".join(cell(record[name, k]) for name in methods))
