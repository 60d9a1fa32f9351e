"""What does a repetition penalty cost per token, for every schedule?

The target alone and each schedule (constant, dynamic, ada; the eager engine, or the compiled one
with `--compile`) run with and without the penalty on every prompt, the methods interleaved per
prompt (the first one rotating), after an untimed warm-up. A penalty changes what is generated, and
so how many tokens the draft gets right: per-token time moves with the counts as well as with the
processing's own cost. The table separates the two: per method, the median per-prompt ratio of
per-token times (penalty / none), the calls per token with and without, and the time of one
verification and of one draft step (with the stop decision), each pooled over the prompts, which
the counts do not move.

    python benchmarks/processing_overhead.py                   # the zoo pair, stdlib-heldout 0-12, 128 tokens
    python benchmarks/processing_overhead.py --compile         # the same on the compiled engine
    python benchmarks/processing_overhead.py --n_end 1 --max_new_tokens 8   # a smoke run
"""
from __future__ import annotations

import argparse
import statistics

import torch

from harness import DRAFT, HEAD, TARGET, load_pair, load_prompt_ids, ms_per_token, rotated, summed, warm_up

from specdecpp import speculative_generate
from specdecpp.engine.decoding import GenerationStats

SCHEDULES = ("none", "constant", "dynamic", "ada")


def run_stats(target, draft, head, prompt: torch.Tensor, schedule: str, max_new_tokens: int,
              repetition_penalty: float | None, compile: bool = False) -> GenerationStats:
    """One generation's `GenerationStats` (`ada` at the head's stored threshold, given as a number
    so that the penalty, which it was not chosen under, does not warn)."""
    knobs = {"head": head, "stop_threshold": head.stop_threshold} if schedule == "ada" else {}
    return speculative_generate(target, draft, prompt, schedule=schedule, max_new_tokens=max_new_tokens,
                                repetition_penalty=repetition_penalty, compile=compile, **knobs).stats


def step_figures(runs: list[GenerationStats]) -> dict[str, float]:
    """Over a method's generations: target and draft calls per token, and ms per verification and
    per draft step (its stop decision included), each total over total."""
    total = summed(runs)
    tokens = max(total["generated_length"], 1)
    return {"target_calls": total["target_calls"] / tokens, "draft_calls": total["draft_calls"] / tokens,
            "verify_ms": 1000 * total["verify_time"] / max(total["target_calls"], 1),
            "draft_ms": 1000 * (total["draft_time"] + total["schedule_time"]) / max(total["draft_calls"], 1)}


def table(runs: dict[tuple[str, float | None], list[GenerationStats]], penalty: float) -> str:
    """The markdown table: per schedule, the median per-token time without and with the penalty,
    the median of their per-prompt ratios, and `step_figures` without -> with."""
    rows = [f"| schedule | none (ms/token) | repetition_penalty={penalty:g} (ms/token) | ratio | "
            "target calls/token | draft calls/token | ms/verification | ms/draft step |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for schedule in SCHEDULES:
        plain, penalized = runs[schedule, None], runs[schedule, penalty]
        ratio = statistics.median(ms_per_token(p) / ms_per_token(n) for p, n in zip(penalized, plain))
        before, after = step_figures(plain), step_figures(penalized)
        figures = [f"{before[key]:.3f} → {after[key]:.3f}" if before[key] else "-"
                   for key in ("target_calls", "draft_calls", "verify_ms", "draft_ms")]
        rows.append(f"| {schedule} | {statistics.median(map(ms_per_token, plain)):.2f} | "
                    f"{statistics.median(map(ms_per_token, penalized)):.2f} | {ratio:.3f} | " + " | ".join(figures) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=TARGET)
    parser.add_argument("--draft", default=DRAFT)
    parser.add_argument("--head", default=HEAD)
    parser.add_argument("--prompts", default="stdlib-heldout")
    parser.add_argument("--n_begin", type=int, default=0)
    parser.add_argument("--n_end", type=int, default=12)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--repetition_penalty", type=float, default=1.2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile", action="store_true", help="the compiled engine (compile=True), warmed up first")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target, draft, head = load_pair(args.target, args.draft, args.head)
    prompts = load_prompt_ids(args.prompts, args.target, args.n_begin, args.n_end)
    methods = [(schedule, penalty) for schedule in SCHEDULES for penalty in (None, args.repetition_penalty)]
    runs = {method: [] for method in methods}

    def run(method: tuple[str, float | None], prompt: torch.Tensor, max_new_tokens: int) -> GenerationStats:
        return run_stats(target, draft, head, prompt, method[0], max_new_tokens, method[1], args.compile)

    with torch.inference_mode():
        warm_up(run, methods, prompts, args.max_new_tokens, compile=args.compile)
        for n, prompt in enumerate(prompts):
            for method in rotated(methods, n):
                runs[method].append(run(method, prompt, args.max_new_tokens))
    print(f"{len(prompts)} prompts ({args.prompts} {args.n_begin}-{args.n_end}), {args.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} thread(s), {'compiled' if args.compile else 'eager'} engine\n")
    print(table(runs, args.repetition_penalty))


if __name__ == "__main__":
    main()
