"""Token trees against chains on the same prompts: tokens per target call (the counts the clock follows on a GPU),
draft steps per token, tree sizes, and the wall time per token (eager, or `--compile`d) beside the time its counts
predict at the given step times. Methods run interleaved per prompt, each output checked against the target's (greedy).

    python benchmarks/token_tree.py --n_begin 100 --n_end 160 --output_json results/token-tree/greedy.json
    python benchmarks/token_tree.py --do_sample --head checkpoints/zoo/head-sampling --output_json ...
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from harness import HEAD, load_pair, load_prompt_ids, rotated, warm_up
from specdecpp.models import load_head
from tqdm import tqdm

from specdecpp.costs import StepTimes
from specdecpp import speculative_generate
from specdecpp.engine.decoding import GenerationStats
from specdecpp.head.folder import stored_step_times
from specdecpp.measuring.step_timing import device_step_times


@dataclass
class Method:
    """One compared method: its name and `speculative_generate`'s settings."""

    name: str
    settings: dict
    runs: list[GenerationStats] = field(default_factory=list)
    tree_head: str | None = None  # ada-tree's head, by name


def methods(head, tree_heads: dict, args) -> list[Method]:
    """Chains (the head's `ada`, `dynamic` per confidence, constant K, the oracle when greedy), then the trees
    (`ada-tree` with each of `tree_heads`, by name)."""
    chain = dict(head=head, bound=(1, 20))
    out = [Method("ada@auto", dict(chain, schedule="ada", stop_threshold="auto"))]
    out += [Method(f"dynamic@{c:g}", dict(schedule="dynamic", assistant_confidence_threshold=c,
                                          num_assistant_tokens=20)) for c in args.confidences]
    out += [Method(f"constant@K={k}", dict(schedule="constant", num_assistant_tokens=k)) for k in args.constants]
    if not args.do_sample:
        out.append(Method("oracle", dict(schedule="oracle", bound=(1, 20))))
    for nodes in args.tree_nodes:
        size = int(nodes) if nodes.isdigit() else nodes
        out += [Method(f"confidence-tree@{t:g},nodes={nodes}", dict(
            schedule="confidence-tree", stop_threshold=t, bound=(1, 20), tree_nodes=size, tree_width=args.tree_width))
            for t in args.tree_confidences]
        out += [Method(f"ada-tree[{name}]@{t if t == 'auto' else f'{float(t):g}'},nodes={nodes}",
                       dict(chain, head=tree_head, schedule="ada-tree", stop_threshold=t if t == "auto" else float(t),
                            tree_nodes=size, tree_width=args.tree_width), tree_head=name)
                for name, tree_head in tree_heads.items() for t in args.ada_tree_thresholds]
    return out


def predicted_ms(stats: GenerationStats, times: StepTimes) -> float:
    """A generation's time at `times`: each round's draft steps at their places' prices (a tree's levels by place
    and, where `times` price levels, width: `StepTimes.level_price`), its verification and the loop's overhead."""
    trees = stats.tree_level_widths
    grown = sum(times.tree_round_ms(widths, nodes) for widths, nodes in zip(trees, stats.draft_lengths))
    chains = zip(stats.draft_lengths[len(trees):], stats.verified_lengths[len(trees):])
    return grown + sum(times.round_ms(drafted, 0, verified) for drafted, verified in chains)


def summary(method: Method, times: StepTimes) -> dict:
    runs = method.runs
    tokens = sum(s.generated_length for s in runs)
    calls = sum(s.target_calls for s in runs)
    used = runs[0].stop_threshold  # where `auto` chose a threshold: the one it chose here
    return {"method": method.name + (f" ({used:g} here)" if used is not None else ""),
            "tokens_per_target_call": tokens / calls,
            "draft_steps_per_token": sum(s.draft_calls for s in runs) / tokens,
            "tree_round_share": sum(s.tree_rounds for s in runs) / calls,
            "mean_drafted": statistics.mean(n for s in runs for n in s.draft_lengths),
            "mean_accepted": statistics.mean(a for s in runs for a in s.accepted_lengths),
            "measured_ms_per_token": 1000 * sum(s.wall_time for s in runs) / tokens,
            "predicted_ms_per_token": sum(predicted_ms(s, times) for s in runs) / tokens,
            "tokens": tokens}


def table(rows: list[dict]) -> str:
    head = "| method | tokens / target call | draft steps / token | tree rounds | drafted / round | accepted / round " \
           "| measured ms / token | predicted ms / token |\n|---|---:|---:|---:|---:|---:|---:|---:|\n"
    return head + "\n".join(
        f"| {r['method']} | {r['tokens_per_target_call']:.3f} | {r['draft_steps_per_token']:.3f} | "
        f"{r['tree_round_share']:.0%} | "
        f"{r['mean_drafted']:.2f} | {r['mean_accepted']:.2f} | {r['measured_ms_per_token']:.2f} | "
        f"{r['predicted_ms_per_token']:.2f} |" for r in rows)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", default=HEAD, help="the chain's head (ada)")
    parser.add_argument("--tree_heads", nargs="+", default=None, help="ada-tree's heads (default: --head)")
    parser.add_argument("--prompts", default="stdlib-heldout")
    parser.add_argument("--n_begin", type=int, default=100)
    parser.add_argument("--n_end", type=int, default=160)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--do_sample", action="store_true", help="sample at temperature 1 (seed = prompt index)")
    parser.add_argument("--confidences", type=float, nargs="+", default=[0.3, 0.4, 0.5])
    parser.add_argument("--constants", type=int, nargs="+", default=[2, 3, 4, 5])
    parser.add_argument("--tree_nodes", nargs="+", default=["16", "auto"])
    parser.add_argument("--tree_width", type=int, default=4)
    parser.add_argument("--tree_confidences", type=float, nargs="+", default=[0.5, 0.7, 0.9],
                        help="confidence-tree's stop thresholds (one method each)")
    parser.add_argument("--ada_tree_thresholds", nargs="+", default=["auto"],
                        help="ada-tree's stop thresholds ('auto': the head's, chosen for this machine's costs)")
    parser.add_argument("--time_steps", action="store_true",
                        help="price the counts at this machine's step times, timed here (else the head's stored)")
    parser.add_argument("--compile", action="store_true", help="every method on the compiled engine")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output_json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, draft, head = (model.to(args.device) for model in load_pair(head=args.head))
    times = device_step_times(target, draft, head, compile=args.compile) if args.time_steps else stored_step_times(args.head)[1]
    prompts = [p.to(args.device) for p in load_prompt_ids(args.prompts, n_begin=args.n_begin, n_end=args.n_end)]
    tree_heads = {Path(path.rstrip("/")).name: load_head(path).to(args.device) for path in args.tree_heads or [args.head]}
    # An ada-tree's levels are priced by width with its own head's judgement, where timed here.
    prices = {name: device_step_times(target, draft, tree_head, compile=args.compile, tree_width=args.tree_width)
              for name, tree_head in tree_heads.items()} if args.time_steps else {}
    compared = methods(head, tree_heads, args)

    def run(method: Method, prompt: torch.Tensor, max_new_tokens: int, seed: int = 0,
            expected: torch.Tensor | None = None) -> GenerationStats:
        # Step times price `auto` trees; an `ada` given them would choose its threshold again at them.
        priced = {"step_times": prices.get(method.tree_head, times)} if method.settings.get("tree_nodes") == "auto" \
            else {}
        out = speculative_generate(target, draft, prompt, max_new_tokens=max_new_tokens, do_sample=args.do_sample,
                                   generator=torch.Generator(args.device).manual_seed(seed), **priced,
                                   compile=args.compile, **method.settings)
        if expected is not None and not torch.equal(out.sequences, expected):
            raise AssertionError(f"{method.name} differs from the target alone")
        return out.stats

    warm_up(run, compared, prompts, args.max_new_tokens, compile=args.compile)
    for index, prompt in enumerate(tqdm(prompts, desc="prompts", unit="prompt")):
        expected = None if args.do_sample else \
            speculative_generate(target, None, prompt, max_new_tokens=args.max_new_tokens).sequences
        for method in rotated(compared, index):
            method.runs.append(run(method, prompt, args.max_new_tokens, index, expected))
    rows = [summary(method, prices.get(method.tree_head, times)) for method in compared]
    source = "timed here" if args.time_steps else "stored with the head"
    report = {"args": vars(args), "table": table(rows),
              "step_times": f"{times.device} {times.engine} {times.processor or ''} ({source})", "methods": rows}
    print(table(rows))
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(report, indent=1) + "\n")
        Path(args.output_json).with_suffix(".md").write_text(table(rows) + "\n")
    return report


if __name__ == "__main__":
    sys.exit(main() and 0)
