"""What does a repetition penalty cost per token? Issue 27's speed goal: with one, every schedule's
per-token time is within 5% of its time without.

Each schedule (constant, dynamic, ada; the eager engine, or the compiled one with `--compile`)
runs with and without the penalty on every prompt, the six methods interleaved per prompt (the
first one rotating), after an untimed warm-up; the per-token time is the loop's wall time over the
tokens generated, and the table shows the medians over prompts and the median of the per-prompt
ratios (penalty / none).

    python benchmarks/processing_overhead.py                   # the zoo pair, stdlib-heldout 0-12, 128 tokens
    python benchmarks/processing_overhead.py --compile         # the same on the compiled engine
    python benchmarks/processing_overhead.py --n_end 1 --max_new_tokens 8   # a smoke run
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from specdecpp import speculative_generate
from specdecpp.models import load_head, load_model, load_tokenizer
from specdecpp.prompts import load_prompts, tokenize_prompt

ZOO = Path(__file__).resolve().parent.parent / "checkpoints" / "zoo"
SCHEDULES = ("constant", "dynamic", "ada")


def per_token_ms(target, draft, head, prompt: torch.Tensor, schedule: str, max_new_tokens: int,
                 repetition_penalty: float | None, compile: bool = False) -> float:
    """One generation's wall time per generated token, in ms (`ada` at the head's stored threshold,
    given as a number so that the penalty, which it was not chosen under, does not warn)."""
    knobs = {"head": head, "stop_threshold": head.stop_threshold} if schedule == "ada" else {}
    out = speculative_generate(target, draft, prompt, schedule=schedule, max_new_tokens=max_new_tokens,
                               repetition_penalty=repetition_penalty, compile=compile, **knobs)
    return 1000 * out.stats.wall_time / max(out.stats.generated_length, 1)


def table(times: dict[tuple[str, float | None], list[float]], penalty: float) -> str:
    """The markdown table: per schedule, the median per-token time without and with the penalty and
    the median of their per-prompt ratios."""
    rows = ["| schedule | none (ms/token) | repetition_penalty=%g (ms/token) | ratio |" % penalty,
            "| --- | ---: | ---: | ---: |"]
    for schedule in SCHEDULES:
        plain, penalized = times[schedule, None], times[schedule, penalty]
        ratio = statistics.median(p / n for p, n in zip(penalized, plain))
        rows.append(f"| {schedule} | {statistics.median(plain):.2f} | {statistics.median(penalized):.2f} "
                    f"| {ratio:.3f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=str(ZOO / "target"))
    parser.add_argument("--draft", default=str(ZOO / "draft"))
    parser.add_argument("--head", default=str(ZOO / "head"))
    parser.add_argument("--prompts", default="stdlib-heldout")
    parser.add_argument("--n_begin", type=int, default=0)
    parser.add_argument("--n_end", type=int, default=12)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--repetition_penalty", type=float, default=1.2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile", action="store_true", help="the compiled engine (compile=True), warmed up first")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target, draft = load_model(args.target), load_model(args.draft)
    head = load_head(args.head)
    tokenizer = load_tokenizer(args.target)
    prompts = [torch.tensor([tokenize_prompt(text, tokenizer, "auto")[1]])
               for text in load_prompts(args.prompts, None, args.n_begin, args.n_end)]
    methods = [(schedule, penalty) for schedule in SCHEDULES for penalty in (None, args.repetition_penalty)]
    times = {method: [] for method in methods}
    with torch.inference_mode():
        for schedule, penalty in methods:  # warm-up, untimed
            per_token_ms(target, draft, head, prompts[0], schedule, min(args.max_new_tokens, 8), penalty, args.compile)
        for n, prompt in enumerate(prompts):
            for schedule, penalty in methods[n % len(methods):] + methods[:n % len(methods)]:
                times[schedule, penalty].append(per_token_ms(target, draft, head, prompt, schedule,
                                                             args.max_new_tokens, penalty, args.compile))
    print(f"{len(prompts)} prompts ({args.prompts} {args.n_begin}-{args.n_end}), {args.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} thread(s), {'compiled' if args.compile else 'eager'} engine\n")
    print(table(times, args.repetition_penalty))


if __name__ == "__main__":
    main()
