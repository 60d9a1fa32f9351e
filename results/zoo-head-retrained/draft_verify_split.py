"""Where `ada`, `dynamic` and constant K (`--with_oracle`: K=4 and the oracle too) spend decoding time, draft steps
and verifications apart, beside what one StepProbe per method (with the head for `ada`) predicts for the rounds each drafted, each prompt's prefill (inside
its first round) timed on its own as `time_breakdown.py` does; zoo pair, held-out stdlib functions 1-12 (0 a
warm-up), 128 tokens, greedy, one engine, methods interleaved. From the repository root:

    python results/zoo-head-retrained/draft_verify_split.py --compile
    python results/zoo-head-retrained/draft_verify_split.py --compile --stop_threshold 0.25 --with_oracle  # verify-steps/
"""
import argparse
import statistics
import sys

import torch

from specdecpp import speculative_generate
from specdecpp.measuring.step_timing import StepProbe, prefill_extra_ms

sys.path.insert(0, "benchmarks")
from harness import HEAD, load_pair, load_prompt_ids  # noqa: E402  (the benchmarks' shared loading)

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--compile", action="store_true")
parser.add_argument("--stop_threshold", type=float, default=0.3)
parser.add_argument("--prompts", type=int, default=13)
parser.add_argument("--with_oracle", action="store_true", help="also constant K=4 and the oracle")
args = parser.parse_args()
torch.set_num_threads(1)
target, draft, head = load_pair(head=HEAD)
prompts = load_prompt_ids("stdlib-heldout", n_end=args.prompts)
context = speculative_generate(target, None, prompts[3], max_new_tokens=64, eos_token_id=[]).sequences
methods = {"dynamic@0.4": dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4),
           "constant K=3": dict(schedule="constant", num_assistant_tokens=3),
           f"ada@{args.stop_threshold:g}": dict(schedule="ada", head=head, stop_threshold=args.stop_threshold,
                                                bound=(1, 20))}
if args.with_oracle:
    methods.update({"constant K=4": dict(schedule="constant", num_assistant_tokens=4),
                    "oracle": dict(schedule="oracle", bound=(1, 20))})
probes = {name: StepProbe(target, draft, context, 20, head=head if name.startswith("ada") else None,
                          compile=args.compile) for name in methods}
totals = {name: dict(draft=0.0, verify=0.0, schedule=0.0, wall=0.0, lengths=[], draft_calls=0, tokens=0, full=0,
                  rounds=0)
          for name in methods}
measured_prompts = []
with torch.inference_mode():
    for i, prompt in enumerate(prompts):
        for name in list(methods)[i % len(methods):] + list(methods)[:i % len(methods)]:
            stats = speculative_generate(target, draft, prompt, max_new_tokens=128, eos_token_id=[],
                                         compile=args.compile, **methods[name]).stats
            if i == 0:
                continue
            total = totals[name]
            total["draft"] += stats.draft_time
            total["verify"] += stats.verify_time
            total["schedule"] += stats.schedule_time
            total["wall"] += stats.wall_time
            total["lengths"] += stats.verified_lengths
            total["full"] += sum(a == v for a, v in zip(stats.accepted_lengths, stats.verified_lengths))
            total["rounds"] += len(stats.verified_lengths)
            total["draft_calls"] += stats.draft_calls
            total["tokens"] += stats.generated_length
        if i:
            measured_prompts.append(prompt)
        for probe in probes.values():
            probe.sample()
print(f"{'compiled' if args.compile else 'eager'} engine, {args.prompts - 1} prompts; ms per token, measured "
      "(predicted by the method's probe, measured/predicted)\n")
print("| method | wall | draft steps | verifications | stop decisions | the rest | a draft step, mean | probe's, j = 1 / 5..20 "
      "| rounds all accepted |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for name, total in totals.items():
    times, tokens = probes[name].times(), total["tokens"]
    # what reading each prompt adds to its first round: the target's to the verification, the draft's to a draft step
    target_prefill = sum(prefill_extra_ms(target, None, p, times, args.compile) for p in measured_prompts)
    both_prefills = sum(prefill_extra_ms(target, draft, p, times, args.compile) for p in measured_prompts)
    # the cost model's own round prices (`StepTimes.round_ms`), a round's verification apart from its drafting
    verifying = [times.round_ms(0, verified=k) - times.round_overhead_ms for k in total["lengths"]]
    predicted_verify = sum(verifying) + target_prefill
    predicted_draft = sum(times.round_ms(k) - times.round_overhead_ms for k in total["lengths"]) - sum(verifying) \
        + both_prefills - target_prefill
    ms = {key: 1000 * total[key] / tokens for key in ("wall", "draft", "verify", "schedule")}
    print(f"| {name} | {ms['wall']:.3f} | {ms['draft']:.3f} ({predicted_draft / tokens:.3f}, {ms['draft'] * tokens / predicted_draft:.3f}x) | "
          f"{ms['verify']:.3f} ({predicted_verify / tokens:.3f}, {ms['verify'] * tokens / predicted_verify:.3f}x) | {ms['schedule']:.3f} | "
          f"{ms['wall'] - ms['draft'] - ms['verify'] - ms['schedule']:.3f} | "
          f"{1000 * total['draft'] / total['draft_calls']:.3f} | {times.draft_ms[0]:.3f} / "
          f"{statistics.median(times.draft_ms[4:20]):.3f} | {total['full'] / total['rounds']:.2f} |")
